// The GPU engine: WebGpuDecoder (rollout/webgpu_decoder.ts) decodes on the WebGPU
// device beside the trainer, KV cache and sampling on the GPU, weights re-laid out
// on the device when the optimizer changed them (verl's weight sync without a copy
// through the host). Registered as "webgpu"; verl's "vllm" and "sglang" pick it
// when the rank's backend is WebGPU and the host decoder otherwise, so a verl
// script's rollout.name=vllm gets the fast engine wherever there is one.
import * as tf from "@tensorflow/tfjs";
import type { DataProto } from "../../protocol/data_proto.js";
import { llamaGraphGap } from "../../models/families.js";
import type { AsyncRolloutServer } from "../../agent_loop/server.js";
import { WebGpuDecoder, webGpuSlotDecoder } from "../webgpu_decoder.js";
import { HostRolloutEngine, slotServer } from "./host.js";
import { generateSeeded, registerRolloutEngine, type RequestServerContext, type RolloutEngine, type RolloutRequest } from "./registry.js";

export class WebGpuRolloutEngine implements RolloutEngine {
  readonly name = "webgpu";
  private readonly decoder = new WebGpuDecoder();

  async generate(req: RolloutRequest): Promise<DataProto> {
    return generateSeeded(req, (prompts, rng) => this.decoder.generate(req.model, prompts, req.params, rng));
  }

  /** Agent loops: the WebGPU decoder's cache slots, one per live request, behind the batching server. */
  requestServer(ctx: RequestServerContext): AsyncRolloutServer {
    return slotServer(ctx, webGpuSlotDecoder);
  }

  async dispose(): Promise<void> {}
}

/** verl's inference-engine names: the GPU engine on a WebGPU rank, the host decoder elsewhere. */
export class BestAvailableRolloutEngine implements RolloutEngine {
  readonly name = "auto";
  /** a MoE model (the only kind with routing to record) always decodes on the host decoder here */
  readonly recordsRouting = true;
  private gpu: WebGpuRolloutEngine | undefined;
  private host: HostRolloutEngine | undefined;

  generate(req: RolloutRequest): Promise<DataProto> {
    if (req.recordRouting) return (this.host ??= new HostRolloutEngine()).generate(req);
    // a family the WebGPU decoder does not serve yet (llamaGraphGap) decodes on the host decoder
    if (tf.getBackend() === "webgpu" && llamaGraphGap(req.model.config, { qkNorm: true }) === null) return (this.gpu ??= new WebGpuRolloutEngine()).generate(req);
    return (this.host ??= new HostRolloutEngine()).generate(req);
  }

  requestServer(ctx: RequestServerContext): AsyncRolloutServer {
    if (tf.getBackend() === "webgpu" && !ctx.recordRouting) return (this.gpu ??= new WebGpuRolloutEngine()).requestServer(ctx);
    return (this.host ??= new HostRolloutEngine()).requestServer(ctx);
  }

  async dispose(): Promise<void> {}
}

registerRolloutEngine("webgpu", () => new WebGpuRolloutEngine());
registerRolloutEngine(["vllm", "sglang"], () => new BestAvailableRolloutEngine());
