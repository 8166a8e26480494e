// The llama_cpp engine's per-request server for agent loops: one llama.cpp context of
// min(max_num_seqs, concurrent loops) sequences; each request takes a free sequence (the one
// holding the longest prefix of its prompt, so a conversation's next turn evaluates only its new
// tokens), decodes there with its own seeded sampler, and gives the sequence back. llama.cpp batches
// the sequences that decode at the same time (continuous batching: requests come and go freely).
import { checkGenerationParams, RequestAbortedError, type AsyncRolloutServer, type GenerationParams, type TokenOutput } from "../../agent_loop/server.js";
import type { RequestServerContext } from "../engines/registry.js";
import type { LlamaContext, LlamaContextSequence } from "./binding.js";
import type { LlamaCppRolloutEngine } from "./engine.js";

interface Slot { seq: LlamaContextSequence; busy: boolean }

export class LlamaCppRequestServer implements AsyncRolloutServer {
  private context: LlamaContext | undefined;
  private opening: Promise<void> | undefined;
  private slots: Slot[] = [];
  private waiters: { resolve: () => void; reject: (e: Error) => void }[] = [];
  /** Bumped by abort(): requests started before it stop at their next token. */
  private epoch = 0;

  constructor(private readonly engine: LlamaCppRolloutEngine, private readonly ctx: RequestServerContext) {}

  /** Sync the weights (GGUF) and open the context; every batch after sleep() re-reads them. */
  wakeUp(): Promise<void> {
    this.opening ??= (async () => {
      const { model, tokenizer, maxNumSeqs, maxModelLen } = this.ctx;
      this.context = await this.engine.requestContext(model, tokenizer, maxNumSeqs, maxModelLen);
      this.slots = Array.from({ length: Math.min(maxNumSeqs, this.engine.settings.maxNumSeqs) }, () => ({ seq: this.context!.getSequence(), busy: false }));
    })();
    return this.opening;
  }

  async generate(_requestId: string, promptIds: readonly number[], params: GenerationParams): Promise<TokenOutput> {
    checkGenerationParams(params);
    const L = this.ctx.maxModelLen, V = this.ctx.model.config.vocabSize, epoch = this.epoch;
    if (promptIds.length === 0) throw new Error("generate: empty prompt");
    if (promptIds.length >= L) throw new Error(`generate: prompt of ${promptIds.length} tokens leaves no room under the model length ${L}`);
    for (const id of promptIds) if (!Number.isInteger(id) || id < 0 || id >= V) throw new Error(`generate: token id ${id} outside the vocabulary [0, ${V})`);
    const maxTokens = Math.min(params.maxTokens ?? L - promptIds.length, L - promptIds.length);
    if (maxTokens === 0) return { tokenIds: [], logProbs: params.logprobs ? [] : undefined, numPreempted: 0, finishReason: "length" };
    await this.wakeUp();
    const slot = await this.acquire(promptIds);
    this.engine.decoding++;
    try {
      if (epoch !== this.epoch) throw new RequestAbortedError();
      const seq = slot.seq, held = seq.contextTokens;
      let keep = 0;
      while (keep < Math.min(held.length, promptIds.length - 1) && held[keep] === promptIds[keep]) keep++;
      if (keep < seq.nextTokenIndex) await seq.eraseContextTokenRanges([{ start: keep, end: seq.nextTokenIndex }]);
      const stop = new Set(params.stopTokenIds ?? this.ctx.tokenizer.eosTokenIds);
      const greedy = params.temperature === 0 || params.doSample === false;
      const seed = params.seed ?? Math.floor(this.ctx.rng.random() * 2 ** 32);
      const sampling = { temperature: greedy ? 0 : params.temperature, topK: params.topK > 0 ? params.topK : 0, topP: params.topP, minP: 0, yieldEogToken: true, seed };
      const tokenIds: number[] = [], logProbs: number[] = [];
      let finishReason: "stop" | "length" = "length";
      for await (const out of seq.evaluateWithMetadata([...promptIds.slice(keep)], { confidence: true }, sampling)) {
        if (epoch !== this.epoch) throw new RequestAbortedError();
        tokenIds.push(out.token);
        logProbs.push(Math.log(Math.max(out.confidence ?? 0, Number.MIN_VALUE)));
        if (stop.has(out.token)) { finishReason = "stop"; break; }
        if (tokenIds.length >= maxTokens) break;
      }
      return { tokenIds, logProbs: params.logprobs ? logProbs : undefined, numPreempted: 0, finishReason };
    } finally {
      this.engine.decoding--;
      this.release(slot);
    }
  }

  /** A free sequence, the one holding the longest prefix of `prompt` first; waits when all are busy. */
  private async acquire(prompt: readonly number[]): Promise<Slot> {
    for (;;) {
      let best: Slot | undefined, bestLen = -1;
      for (const s of this.slots) {
        if (s.busy) continue;
        const held = s.seq.contextTokens;
        let j = 0;
        while (j < held.length && j < prompt.length && held[j] === prompt[j]) j++;
        if (j > bestLen) { best = s; bestLen = j; }
      }
      if (best) { best.busy = true; return best; }
      await new Promise<void>((resolve, reject) => this.waiters.push({ resolve, reject }));
    }
  }

  private release(slot: Slot): void {
    slot.busy = false;
    this.waiters.shift()?.resolve();
  }

  abort(): void {
    this.epoch++;
    for (const w of this.waiters.splice(0)) w.reject(new RequestAbortedError());
  }

  /** Once idle, give the sequences back; the next batch syncs the (changed) weights again. */
  async sleep(): Promise<void> {
    while (this.slots.some((s) => s.busy)) await new Promise<void>((resolve) => this.waiters.push({ resolve, reject: () => resolve() }));
    await Promise.all(this.slots.map((s) => s.seq.dispose()));
    this.slots = [];
    this.context = undefined;
    this.opening = undefined;
  }
}
