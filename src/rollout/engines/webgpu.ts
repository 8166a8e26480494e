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
import { WebGpuDecoder, WebGpuSlotDecoder } from "../webgpu_decoder.js";
import { HostRolloutEngine, slotServer } from "./host.js";
import { generateSeeded, registerRolloutEngine, type RequestServerContext, type RolloutEngine, type RolloutEngineContext, type RolloutRequest } from "./registry.js";
import { parsePrecision, tensorCoreSupport, type MatmulPrecision } from "../../engine/webgpu_kernels.js";

/**
 * actor_rollout_ref.rollout.dtype as the WebGPU decoder's precision (conf/ defaults to float32;
 * verl's own default, bfloat16, is what a script gets by setting it).
 */
export function rolloutPrecision(ctx: RolloutEngineContext | undefined): { precision: MatmulPrecision; key: string } {
  const key = ctx ? ctx.rollout.key("dtype") : "actor_rollout_ref.rollout.dtype";
  return { precision: ctx ? parsePrecision(ctx.rollout.str("dtype", "float32"), key) : "f32", key };
}

export class WebGpuRolloutEngine implements RolloutEngine {
  readonly name = "webgpu";
  private decoder: WebGpuDecoder | undefined;
  private readonly asked: { precision: MatmulPrecision; key: string };
  private settled: MatmulPrecision | undefined;

  constructor(ctx?: RolloutEngineContext) {
    this.asked = rolloutPrecision(ctx);
  }

  /**
   * The precision both decoders use, settled on first use (the adapter is known by then); 16-bit
   * falls back to float32 with one line where the adapter lacks the tensor cores.
   */
  private precision(): MatmulPrecision {
    if (this.settled) return this.settled;
    let precision = this.asked.precision;
    if (precision !== "f32") {
      const ok = tensorCoreSupport.available;
      console.error(ok
        ? `[verl-ts] ${this.asked.key}=${precision}: WebGPU decoder weights packed to f16 once per weight change, products on the tensor cores (f32 accumulation)`
        : `[verl-ts] ${this.asked.key}=${precision}: no tensor-core kernel here (${tensorCoreSupport.reason}); the WebGPU decoder stays float32`);
      if (!ok) precision = "f32";
    }
    return (this.settled = precision);
  }

  private get dec(): WebGpuDecoder {
    return (this.decoder ??= new WebGpuDecoder({ precision: this.precision() }));
  }

  async generate(req: RolloutRequest): Promise<DataProto> {
    return generateSeeded(req, (prompts, rng) => this.dec.generate(req.model, prompts, req.params, rng));
  }

  /**
   * Agent loops: the WebGPU decoder's cache slots, one per live request, behind the batching server
   * (sampling on the device), at the batch decoder's precision. (Its 16-bit products once gave
   * non-finite log-probs at Qwen2.5-0.5B's shape: a packed SwiGLU program's row count was baked into
   * a shader cached without it; fixed in f08d173, re-measured finite on the H200 on 2026-12-05.)
   */
  requestServer(ctx: RequestServerContext): AsyncRolloutServer {
    const precision = this.precision();
    return slotServer(ctx, (model, slots, maxLen) => new WebGpuSlotDecoder(model, slots, maxLen, { precision }));
  }

  async dispose(): Promise<void> {}
}

/** verl's inference-engine names: the GPU engine on a WebGPU rank, the host decoder elsewhere. */
export class BestAvailableRolloutEngine implements RolloutEngine {
  readonly name = "auto";
  /** a MoE model (the only kind with routing to record) always decodes on the host decoder here */
  readonly recordsRouting = true;
  /** speculative decoding runs on the host decoder (single-turn rollouts and the agent loops' slots) */
  readonly draftsWithMtp = true;
  private gpu: WebGpuRolloutEngine | undefined;
  private host: HostRolloutEngine | undefined;
  constructor(private readonly ctx?: RolloutEngineContext) {}

  generate(req: RolloutRequest): Promise<DataProto> {
    if (req.recordRouting || req.mtpDraft) return (this.host ??= new HostRolloutEngine()).generate(req);
    // a family the WebGPU decoder does not serve yet (llamaGraphGap) decodes on the host decoder
    if (tf.getBackend() === "webgpu" && llamaGraphGap(req.model.config, { qkNorm: true }) === null) return (this.gpu ??= new WebGpuRolloutEngine(this.ctx)).generate(req);
    return (this.host ??= new HostRolloutEngine()).generate(req);
  }

  requestServer(ctx: RequestServerContext): AsyncRolloutServer {
    // the MTP draft decodes on the host slot decoder, as single-turn speculative rollouts do
    if (tf.getBackend() === "webgpu" && !ctx.recordRouting && !ctx.mtpDraft) return (this.gpu ??= new WebGpuRolloutEngine(this.ctx)).requestServer(ctx);
    return (this.host ??= new HostRolloutEngine()).requestServer(ctx);
  }

  async dispose(): Promise<void> {}
}

registerRolloutEngine("webgpu", (ctx) => new WebGpuRolloutEngine(ctx));
registerRolloutEngine(["vllm", "sglang"], (ctx) => new BestAvailableRolloutEngine(ctx));
