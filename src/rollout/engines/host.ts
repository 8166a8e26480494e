// The host engine: the KV-cache decoder on host Float32Arrays (rollout/decoder.ts)
// over the actor's own weights, no copy to sync beyond the decoder's cached layout.
// Registered as "tfjs" (verl-ts's default), "hf" and "naive"; verl's "vllm" and
// "sglang" select it too on a CPU rank (engines/webgpu.ts), so verl's configs run unchanged.
import type { DataProto } from "../../protocol/data_proto.js";
import { readParamsForDecode } from "../decode_weights.js";
import { generate } from "../generate.js";
import { generateSeeded, registerRolloutEngine, type RolloutEngine, type RolloutRequest } from "./registry.js";

export const HOST_ENGINE_NAMES = ["tfjs", "hf", "naive"] as const;

export class HostRolloutEngine implements RolloutEngine {
  readonly name = "tfjs";

  async generate(req: RolloutRequest): Promise<DataProto> {
    // the decoder copies the weights: read them asynchronously first (WebGPU has no sync read)
    await readParamsForDecode(req.model);
    return generateSeeded(req, (prompts, rng) => generate(req.model, prompts, req.params, rng));
  }

  async dispose(): Promise<void> {}
}

registerRolloutEngine(HOST_ENGINE_NAMES, () => new HostRolloutEngine());
