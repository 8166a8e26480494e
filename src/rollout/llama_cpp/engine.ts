// The llama_cpp rollout engine (rollout.name=llama_cpp): llama.cpp through
// node-llama-cpp, on its Vulkan/CUDA build where one loads, else on the CPU.
// Weights are synced by GGUF (weights.ts). All rows of a batch share one context
// of up to max_num_seqs sequences (continuous batching: a sequence that finishes
// takes the next row), prompts go in as token ids (no detokenize/retokenize), and
// each row samples with its own seeded llama.cpp sampler chain. The sampled
// token's probability comes back with it, as rollout_log_probs.
import type { DataProto } from "../../protocol/data_proto.js";
import type { ConfigView } from "../../workers/config_view.js";
import type { GgufWeightType } from "../../models/gguf.js";
import { assembleRollout, promptRows } from "../generate.js";
import { isGreedy, type SamplingParams } from "../sampling.js";
import { registerRolloutEngine, type RequestServerContext, type RolloutEngine, type RolloutRequest } from "../engines/registry.js";
import type { AsyncRolloutServer } from "../../agent_loop/server.js";
import { LlamaCppRequestServer } from "./server.js";
import { loadLlama, type Llama, type LlamaContext, type LlamaContextSequence, type LlamaGpuSetting, type LlamaModelHandle } from "./binding.js";
import { GgufWeightSync } from "./weights.js";
import { llamaThreadsHere } from "./threads.js";
import { logger } from "../../utils/logger.js";

/** Seconds between progress lines while a rollout runs (a CPU rollout can take minutes). */
const PROGRESS_EVERY_S = 10;

/** llama.cpp's bound on the sequences of one context (LLAMA_MAX_SEQ). */
export const LLAMA_MAX_SEQUENCES = 256;

export interface LlamaCppSettings {
  weightType: GgufWeightType;
  /** KV cache type: f32 keeps parity with the training engine (f16 drifted after a few tokens at 60M). */
  kvCacheType: "f32" | "f16";
  gpu: LlamaGpuSetting;
  ggufDir: string;
  /** CPU threads (0: the usable cores shared among the host's ranks, threads.ts). */
  threads: number;
  flashAttention: boolean;
  maxNumSeqs: number;
}

function oneOf<T extends string>(view: ConfigView, key: string, allowed: readonly T[], fallback: T): T {
  const v = view.str(key, fallback);
  if (!allowed.includes(v as T)) throw new Error(`${view.key(key)} must be one of ${allowed.join(", ")}, got '${v}'`);
  return v as T;
}

/** Settings from actor_rollout_ref.rollout (engine_kwargs.llama_cpp.* and max_num_seqs). */
export function llamaCppSettings(rollout: ConfigView): LlamaCppSettings {
  const k = rollout.at("engine_kwargs.llama_cpp");
  const maxNumSeqs = rollout.int("max_num_seqs", LLAMA_MAX_SEQUENCES);
  if (maxNumSeqs < 1) throw new Error(`${rollout.key("max_num_seqs")} must be >= 1, got ${maxNumSeqs}`);
  const threads = k.int("threads", 0);
  if (threads < 0) throw new Error(`${k.key("threads")} must be >= 0, got ${threads}`);
  return {
    weightType: oneOf(k, "weight_dtype", ["f32", "f16"] as const, "f32"),
    kvCacheType: oneOf(k, "kv_cache_dtype", ["f32", "f16"] as const, "f32"),
    gpu: oneOf(k, "gpu", ["auto", "cpu", "vulkan", "cuda"] as const, "auto"),
    ggufDir: k.str("gguf_dir", "/dev/shm"),
    threads,
    flashAttention: k.bool("flash_attention", false),
    maxNumSeqs: Math.min(maxNumSeqs, LLAMA_MAX_SEQUENCES),
  };
}

/** A 32-bit seed per (row seed, sample index), so the n samples of a prompt differ. */
function mixSeed(seed: number, k: number): number {
  let h = (seed ^ Math.imul(k + 1, 0x9e3779b1)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b) >>> 0;
  return (h ^ (h >>> 13)) >>> 0;
}

interface OpenContext { context: LlamaContext; sequences: number; length: number; model: LlamaModelHandle }

export class LlamaCppRolloutEngine implements RolloutEngine {
  readonly name = "llama_cpp";
  private llama: Llama | undefined;
  private sync: GgufWeightSync | undefined;
  private open: OpenContext | undefined;
  /** Rows being decoded now: the batch is sent to llama.cpp once all of them queued their token. */
  decoding = 0;
  /** Seconds of the last call: weight sync, and generation. */
  readonly timing = { syncSeconds: 0, generateSeconds: 0, tokens: 0 };

  /** The CPU threads given to llama.cpp, and why (threads.ts). */
  readonly threads: { threads: number; why: string };

  constructor(readonly settings: LlamaCppSettings, private readonly tag: string) {
    this.threads = llamaThreadsHere(settings.threads);
  }

  async generate(req: RolloutRequest): Promise<DataProto> {
    const { model, tokenizer, params } = req;
    const { data, ids, mask, pos, B, P } = promptRows(req.prompts, params, model.config.vocabSize);
    const R = params.responseLength, n = params.n ?? 1;
    if (req.rowSeeds && req.rowSeeds.length !== req.prompts.length) throw new Error(`llama_cpp rollout: ${req.rowSeeds.length} row seeds for ${req.prompts.length} prompts`);

    if (!this.llama) {
      this.llama = await loadLlama(this.settings.gpu);
      logger().info({ engine: "llama_cpp", rank: this.tag, build: this.llama.gpu || "cpu", threads: this.threads.threads, why: this.threads.why }, "llama_cpp engine loaded");
    }
    this.sync ??= new GgufWeightSync(this.llama, {
      weightType: this.settings.weightType, dir: this.settings.ggufDir, gpuLayers: this.llama.gpu ? "max" : 0, tag: this.tag,
    });
    const { handle, changed } = await this.sync.current(model, tokenizer);
    this.timing.syncSeconds = this.sync.lastSyncSeconds;
    const t0 = performance.now();
    const context = await this.contextFor(handle, changed, Math.min(B, this.settings.maxNumSeqs), P + R, P);

    const prompts = Array.from({ length: B }, (_, b) => {
      const row: number[] = [];
      for (let s = 0; s < P; s++) if (mask[b * P + s]) row.push(ids[b * P + s]!);
      if (row.length === 0) throw new Error(`llama_cpp rollout: prompt row ${b} is all padding`);
      return row;
    });
    const seeds = Array.from({ length: B }, (_, b) => (req.rowSeeds ? mixSeed(req.rowSeeds[Math.floor(b / n)]!, b % n) : Math.floor(req.rng.random() * 2 ** 32)));

    const responses = new Int32Array(B * R).fill(params.padTokenId);
    const responseMask = new Int32Array(B * R);
    const logProbs = new Float32Array(B * R);
    const sampling = samplerOptions(params);
    const eos = new Set(params.ignoreEos ? [] : params.eosTokenIds);
    let nextRow = 0, tokens = 0, rowsDone = 0;
    const runSequence = async (seq: LlamaContextSequence) => {
      try {
        for (let b = nextRow++; b < B; b = nextRow++) {
          await seq.clearHistory();
          this.decoding++;
          try {
            let t = 0;
            for await (const out of seq.evaluateWithMetadata(prompts[b]!, { confidence: true }, { ...sampling, seed: seeds[b]! })) {
              responses[b * R + t] = out.token;
              responseMask[b * R + t] = 1;
              logProbs[b * R + t] = Math.log(Math.max(out.confidence ?? 0, Number.MIN_VALUE));
              t++;
              if (t >= R || eos.has(out.token)) break;
            }
            tokens += t;
            rowsDone++;
          } finally {
            this.decoding--;
          }
        }
      } finally {
        await seq.dispose();
      }
    };
    const seqs = Array.from({ length: Math.min(B, this.open!.sequences) }, () => context.getSequence());
    const progress = setInterval(() => {
      const s = (performance.now() - t0) / 1000;
      logger().info({ engine: "llama_cpp", rank: this.tag, rows: `${rowsDone}/${B}`, tokens, tokens_per_s: Math.round(tokens / s), elapsed_s: Math.round(s) }, "llama_cpp rollout progress");
    }, PROGRESS_EVERY_S * 1000);
    progress.unref();
    try {
      await Promise.all(seqs.map(runSequence));
    } finally {
      clearInterval(progress);
    }
    this.timing.generateSeconds = (performance.now() - t0) / 1000;
    this.timing.tokens = tokens;
    return assembleRollout(data, { ids, mask, pos, B, P, R, responses, responseMask, logProbs: params.calculateLogProbs ? logProbs : undefined });
  }

  /** A context for the per-request server: weights synced, `sequences` x `length` cells. */
  async requestContext(model: RolloutRequest["model"], tokenizer: RolloutRequest["tokenizer"], sequences: number, length: number): Promise<LlamaContext> {
    this.llama ??= await loadLlama(this.settings.gpu);
    this.sync ??= new GgufWeightSync(this.llama, {
      weightType: this.settings.weightType, dir: this.settings.ggufDir, gpuLayers: this.llama.gpu ? "max" : 0, tag: this.tag,
    });
    const { handle, changed } = await this.sync.current(model, tokenizer);
    return this.contextFor(handle, changed, Math.min(sequences, this.settings.maxNumSeqs), length, Math.min(length, 256));
  }

  /** Agent loops: requests on the context's sequences, a conversation's state kept for its next turn. */
  requestServer(ctx: RequestServerContext): AsyncRolloutServer {
    return new LlamaCppRequestServer(this, ctx);
  }

  /** A context of `sequences` x `length` cells on `handle`, reused while both fit. */
  private async contextFor(handle: LlamaModelHandle, modelChanged: boolean, sequences: number, length: number, promptLength: number): Promise<LlamaContext> {
    const o = this.open;
    if (o && !modelChanged && o.model === handle && o.sequences >= sequences && o.length >= length) return o.context;
    if (o && o.model === handle) await o.context.dispose();
    this.open = undefined;
    const kv = this.settings.kvCacheType.toUpperCase();
    let created: LlamaContext | undefined;
    const context = await handle.createContext({
      sequences, contextSize: length,
      // one decode step of every sequence fits one batch; prompts fill up to 2048 tokens at a time
      batchSize: Math.max(sequences, Math.min(2048, sequences * promptLength)),
      threads: this.threads.threads,
      flashAttention: this.settings.flashAttention,
      experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv,
      batching: { dispatchSchedule: (dispatch) => (created ? this.dispatchWhenAllQueued(dispatch, created) : dispatch()) },
      failedCreationRemedy: false,
    });
    created = context;
    this.open = { context, sequences, length, model: handle };
    return context;
  }

  /**
   * node-llama-cpp sends queued tokens on the next event-loop turn by default; rows
   * whose sampling finished a little later would then go in a batch of their own and
   * the batches would fragment. Wait (a few ms at most) until every decoding row queued.
   */
  private dispatchWhenAllQueued(dispatch: () => void, context: LlamaContext): void {
    const start = performance.now();
    const queued = () => (context as unknown as { _queuedDecodeSequenceIds?: Set<number> })._queuedDecodeSequenceIds?.size ?? Infinity;
    const tick = () => {
      if (queued() >= this.decoding || performance.now() - start > 5) dispatch();
      else setImmediate(tick);
    };
    setImmediate(tick);
  }

  async dispose(): Promise<void> {
    if (this.open) await this.open.context.dispose();
    this.open = undefined;
    await this.sync?.release();
  }
}

/**
 * verl's sampling settings as llama.cpp's chain (top-k, top-p, temperature, then a
 * seeded draw; greedy when temperature is 0 or do_sample is false). node-llama-cpp's
 * own defaults (top_k 40, top_p 0.95) are overridden. The reported probability is
 * that of the chosen token within the final candidates: with top-k/top-p off (verl's
 * defaults) exactly softmax(logits / temperature), as the host engine reports.
 */
export function samplerOptions(p: SamplingParams): { temperature: number; topK: number; topP: number; minP: number; yieldEogToken: boolean } {
  const greedy = isGreedy(p);
  return { temperature: greedy ? 0 : p.temperature, topK: p.topK > 0 ? p.topK : 0, topP: p.topP, minP: 0, yieldEogToken: true };
}

registerRolloutEngine("llama_cpp", (ctx) => new LlamaCppRolloutEngine(llamaCppSettings(ctx.rollout), `r${ctx.rank}`));
