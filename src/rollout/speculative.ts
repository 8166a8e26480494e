// Speculative decoding with MiMo's MTP layer as the draft (model.mtp.enable_rollout; vLLM's
// speculative_config {method: mtp, num_speculative_tokens: k}) for single-turn rollouts: each
// prompt row gets a cache slot of SpeculativeSlots (speculative_slots.ts, also the agent loops'
// engine), which drafts k tokens per step with the MTP layer, verifies them with the trunk in one
// call and keeps them by the standard speculative rejection sampling: every token is distributed
// exactly as plain decoding draws it (temperature, top-k and top-p applied to both the trunk's p
// and the draft's q), and greedy decoding gives plain decoding's tokens. A slot holds a row's
// prompt without its left padding, so the rows' positions must be verl's (cumsum(mask) - 1).
import type { LlamaModel } from "../models/llama.js";
import type { DataProto } from "../protocol/data_proto.js";
import { heartbeat } from "../single_controller/heartbeat.js";
import type { Rng } from "../utils/rng.js";
import { hostKernels } from "../engine/host_kernels.js";
import { KvCacheDecoder } from "./decoder.js";
import { assembleRollout, promptRows } from "./generate.js";
import { TokenSampler, type SamplingParams } from "./sampling.js";
import { SpeculativeSlots, type SpeculativeRow } from "./speculative_slots.js";
import type { SpeculativeStats } from "./mtp_draft.js";

export { drawFrom, judgeDraft, MtpInput, mtpDraftModel, type SpeculativeStats } from "./mtp_draft.js";

/**
 * `generate` with speculative decoding: the same output layout and distribution, fewer trunk calls
 * when drafts are accepted. The KV-cache engine; no routing record (MiMo has no experts).
 * `draftTokens` (default 1) drafts per step, chained from the one MTP layer. The prompts of a
 * sub-batch are prefilled together; `prefill: "rows"` runs one prompt at a time instead (the same
 * tokens and log-probs: the reference the batched prefill is tested against).
 */
export function generateSpeculative(model: LlamaModel, batch: DataProto, params: SamplingParams, rng: Rng,
  opts: { stats?: SpeculativeStats; draftTokens?: number; prefill?: "batched" | "rows"; onStep?: (step: number, responseLength: number) => void } = {}): DataProto {
  const c = model.config;
  if (!c.mtpLayers) throw new Error("speculative decoding: the model has no multi-token-prediction layers (num_nextn_predict_layers; MiMo has them)");
  const { data, ids, mask, pos, B, P } = promptRows(batch, params, c.vocabSize);
  const R = params.responseLength, V = c.vocabSize, k = opts.draftTokens ?? 1;
  const responses = new Int32Array(B * R).fill(params.padTokenId), responseMask = new Int32Array(B * R), logProbs = new Float32Array(B * R);
  const eos = new Set(params.ignoreEos ? [] : params.eosTokenIds);
  const sampler = new TokenSampler(V, params);
  const stats = opts.stats ?? { drafted: 0, accepted: 0 };
  // each row's prompt without its padding, checked against its positions
  const prompts = Array.from({ length: B }, (_, b) => {
    const p: number[] = [];
    for (let s = 0; s < P; s++) {
      if (!mask[b * P + s]) continue;
      if (pos[b * P + s] !== p.length) throw new Error(`speculative decoding: row ${b}'s position_ids must count 0, 1, ... over its prompt tokens (left padding, cumsum(mask) - 1); column ${s} has ${pos[b * P + s]}`);
      p.push(ids[b * P + s]!);
    }
    if (p.length === 0) throw new Error(`speculative decoding: row ${b} has an empty prompt`);
    return p;
  });
  const maxLen = P + R + 1, bytesPerRow = 2 * (c.nLayers + 1) * c.nKvHeads * c.headDim * maxLen * 4;
  const sub = Math.max(1, Math.min(B, Math.floor((512 * 2 ** 20) / bytesPerRow)));
  for (let b0 = 0; b0 < B; b0 += sub) {
    const nb = Math.min(sub, B - b0), maxRowsPerCall = Math.max((k + 1) * nb, Math.min(2048, 64 * nb));
    const trunk = new KvCacheDecoder(model, nb, maxLen, { maxRowsPerCall });
    const spec = new SpeculativeSlots(model, trunk, nb, maxLen, maxRowsPerCall, stats, hostKernels(), k);
    try {
      const emitted = new Int32Array(nb), done = new Uint8Array(nb);
      const first = opts.prefill === "rows" ? null : spec.prefillRows(prompts.slice(b0, b0 + nb).map((prompt, slot) => ({ slot, prompt, reuse: 0 })));
      let live: SpeculativeRow[] = [];
      for (let b = 0; b < nb; b++) {
        const prompt = prompts[b0 + b]!;
        const r: SpeculativeRow = {
          slot: b, cached: prompt.slice(), next: -1, sampler, rng, draft: 0,
          emit: (token, logProb) => { // false when the row is done
            const j = emitted[b]!++, at = (b0 + b) * R + j;
            responses[at] = token; responseMask[at] = 1; logProbs[at] = logProb;
            r.next = token;
            if (eos.has(token) || j + 1 >= R) done[b] = 1;
            return !done[b];
          },
        };
        const { token, logProb } = first ? sampler.sample(first, b * V, rng) : sampler.sample(spec.prefill(b, prompt, 0), 0, rng);
        if (r.emit(token, logProb)) live.push(r);
      }
      let step = 1;
      opts.onStep?.(step, R);
      while (live.length > 0) {
        heartbeat();
        for (const r of live) r.draft = Math.min(k, R - emitted[r.slot]! - 1);
        spec.step(live);
        live = live.filter((r) => !done[r.slot]);
        opts.onStep?.(++step, R);
      }
    } finally {
      spec.dispose();
      trunk.dispose();
    }
  }
  return assembleRollout(data, { ids, mask, pos, B, P, R, responses, responseMask, logProbs: params.calculateLogProbs ? logProbs : undefined });
}
