// The host engine: the KV-cache decoder on host Float32Arrays (rollout/decoder.ts)
// over the actor's own weights, no copy to sync beyond the decoder's cached layout.
// Registered as "tfjs" (verl-ts's default), "hf" and "naive"; verl's "vllm" and
// "sglang" select it too on a CPU rank (engines/webgpu.ts), so verl's configs run unchanged.
import { DataProto } from "../../protocol/data_proto.js";
import { Rng } from "../../utils/rng.js";
import { readParamsForDecode } from "../decode_weights.js";
import { generate } from "../generate.js";
import { registerRolloutEngine, type RolloutEngine, type RolloutRequest } from "./registry.js";

export const HOST_ENGINE_NAMES = ["tfjs", "hf", "naive"] as const;

export class HostRolloutEngine implements RolloutEngine {
  readonly name = "tfjs";

  async generate(req: RolloutRequest): Promise<DataProto> {
    const { model, prompts, params, rng, rowSeeds } = req;
    // the decoder copies the weights: read them asynchronously first (WebGPU has no sync read)
    await readParamsForDecode(model);
    if (!rowSeeds) return generate(model, prompts, params, rng);
    if (rowSeeds.length !== prompts.length) throw new Error(`rollout: ${rowSeeds.length} row seeds for ${prompts.length} prompts`);
    return DataProto.concat(rowSeeds.map((seed, i) => generate(model, prompts.slice(i, i + 1), params, new Rng(seed))));
  }

  async dispose(): Promise<void> {}
}

registerRolloutEngine(HOST_ENGINE_NAMES, () => new HostRolloutEngine());
