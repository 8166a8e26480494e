// The rollout server the agent loops talk to: token ids in, token ids out,
// one request per assistant turn. Many loops await it at once; a batching
// implementation (ContinuousBatchingServer) decodes their requests together.
import type { TensorData } from "../protocol/tensor.js";

/** Sampling for one request (verl's sampling_params dict, camel-cased). */
export interface GenerationParams {
  /** 0 (or doSample false) means greedy. */
  temperature: number;
  /** Nucleus mass kept; 1 keeps everything. */
  topP: number;
  /** Candidates kept; -1 or 0 keeps everything. */
  topK: number;
  /** False forces greedy decoding whatever the temperature. */
  doSample?: boolean;
  /** Most new tokens to produce (the server may clamp it to its context). */
  maxTokens?: number;
  /** Ids that end the request; the stop id itself is returned. Defaults to the server's EOS ids. */
  stopTokenIds?: number[];
  /** Return the log-probability of every sampled token. */
  logprobs?: boolean;
  /** Seed of this request's sampling stream (else the server draws one). */
  seed?: number;
}

/**
 * Params seeded for turn `turn` of a row that carries `rollout_seed` (rollout.seed_per_sample):
 * turn 0 uses the row seed itself, as `generate` does, so samples do not depend on
 * how the batch is split or scheduled; later turns get distinct streams.
 */
export function seededForTurn(params: GenerationParams, rolloutSeed: unknown, turn: number): GenerationParams {
  if (typeof rolloutSeed !== "number") return params;
  return { ...params, seed: turn === 0 ? rolloutSeed : (rolloutSeed ^ Math.imul(turn, 0x9e3779b1)) >>> 0 };
}

export interface TokenOutput {
  tokenIds: number[];
  /** log p(token) under the temperature-scaled distribution, when `logprobs` was asked for. */
  logProbs?: number[];
  /** Times the request was evicted and recomputed; -1 when unknown. */
  numPreempted?: number;
  /** "stop" when a stop id ended it, "length" when maxTokens or the context did. */
  finishReason?: "stop" | "length";
  /**
   * MoE, from a server that records routing (rollout.enable_rollout_routing_replay): the experts each
   * token of prompt + output was routed to, [prompt + output, sparseLayers, topK]; the last output
   * token is never fed back and reads 0.
   */
  routedExperts?: TensorData;
}

export interface AsyncRolloutServer {
  generate(requestId: string, promptIds: readonly number[], params: GenerationParams): Promise<TokenOutput>;
  /**
   * Optional: stop one request (its caller went away); it is rejected and its slot freed. Unknown or
   * finished ids are ignored.
   */
  cancel?(requestId: string): void;
  /**
   * Optional: get ready for a batch with the current weights (verl's rollout wake_up), e.g.
   * read them back from the device; the manager awaits it before the batch's loops start.
   */
  wakeUp?(): Promise<void>;
  /**
   * Optional: stop every request now (verl's abort_request(abort_all=True)); each pending
   * generate rejects with RequestAbortedError. Without it, requests in flight run to the end.
   */
  abort?(): void;
  /**
   * Optional: free caches and forget the weights once idle (verl's rollout sleep).
   * The manager calls it after every batch, since the trainer updates weights in between.
   */
  sleep?(): Promise<void>;
}

/** What a request stopped by `abort` rejects with. */
export class RequestAbortedError extends Error {
  constructor() {
    super("rollout request aborted");
    this.name = "RequestAbortedError";
  }
}

/** Throws a clear error for impossible parameters (a bad config key reaches here). */
export function checkGenerationParams(params: GenerationParams): void {
  const { temperature, topP, topK, maxTokens } = params;
  if (!Number.isFinite(temperature) || temperature < 0) throw new Error(`sampling temperature must be >= 0, got ${temperature}`);
  if (!(topP > 0 && topP <= 1)) throw new Error(`sampling top_p must be in (0, 1], got ${topP}`);
  if (!Number.isInteger(topK) || topK < -1) throw new Error(`sampling top_k must be -1, 0 or a positive integer, got ${topK}`);
  if (maxTokens !== undefined && (!Number.isInteger(maxTokens) || maxTokens < 0)) {
    throw new Error(`max tokens must be a non-negative integer, got ${maxTokens}`);
  }
}
