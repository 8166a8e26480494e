// The host engine: the KV-cache decoder on host Float32Arrays (rollout/decoder.ts)
// over the actor's own weights, no copy to sync beyond the decoder's cached layout.
// Registered as "tfjs" (verl-ts's default), "hf" and "naive"; verl's "vllm" and
// "sglang" select it too on a CPU rank (engines/webgpu.ts), so verl's configs run unchanged.
import type { DataProto } from "../../protocol/data_proto.js";
import { ContinuousBatchingServer } from "../../agent_loop/batching_server.js";
import type { AsyncRolloutServer } from "../../agent_loop/server.js";
import { readParamsForDecode } from "../decode_weights.js";
import type { SlotDecoderFactory } from "../decoder.js";
import { generate } from "../generate.js";
import { generateSpeculative, mtpDraftModel } from "../speculative.js";
import { generateSeeded, registerRolloutEngine, type RequestServerContext, type RolloutEngine, type RolloutRequest } from "./registry.js";

/** A continuous-batching server over `decoder`'s cache slots (the host KvCacheDecoder when absent). */
export function slotServer(ctx: RequestServerContext, decoder?: SlotDecoderFactory): AsyncRolloutServer {
  return new ContinuousBatchingServer(ctx.model, {
    maxNumSeqs: ctx.maxNumSeqs, maxModelLen: ctx.maxModelLen, eosTokenIds: [...ctx.tokenizer.eosTokenIds], rng: ctx.rng, decoder, recordRouting: ctx.recordRouting,
    ...(ctx.mtpDraft ? { mtpDraft: ctx.mtpDraft, mtpDraftTokens: ctx.mtpDraftTokens } : {}),
  });
}

export const HOST_ENGINE_NAMES = ["tfjs", "hf", "naive"] as const;

export class HostRolloutEngine implements RolloutEngine {
  readonly name = "tfjs";
  readonly recordsRouting = true;
  readonly draftsWithMtp = true;

  async generate(req: RolloutRequest): Promise<DataProto> {
    // the decoder copies the weights: read them asynchronously first (WebGPU has no sync read)
    await readParamsForDecode(req.model);
    const stats = req.mtpDraft;
    if (stats) await readParamsForDecode(mtpDraftModel(req.model));
    if (stats) return generateSeeded(req, (prompts, rng) => generateSpeculative(req.model, prompts, req.params, rng, { stats, draftTokens: req.mtpDraftTokens }));
    return generateSeeded(req, (prompts, rng) => generate(req.model, prompts, req.params, rng, { recordRouting: req.recordRouting }));
  }

  /**
   * The host KV-cache decoder's slots, one per live request; a finished turn's cache is parked for the next.
   * With ctx.mtpDraft, each step drafts with the MTP layer and verifies with the trunk (rollout/speculative_slots.ts).
   */
  requestServer(ctx: RequestServerContext): AsyncRolloutServer {
    return slotServer(ctx);
  }

  async dispose(): Promise<void> {}
}

registerRolloutEngine(HOST_ENGINE_NAMES, () => new HostRolloutEngine());
