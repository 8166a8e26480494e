// Rollout engines by name, as verl picks vLLM / SGLang / HF by
// actor_rollout_ref.rollout.name. An engine turns left-padded prompts into verl's
// rollout batch with the actor's current weights; it owns whatever copy of the
// weights it needs and refreshes it when they change (verl's weight sync).
// Users add engines with `registerRolloutEngine` (e.g. from an external_lib module).
import { DataProto } from "../../protocol/data_proto.js";
import { Rng } from "../../utils/rng.js";
import type { LlamaModel } from "../../models/llama.js";
import type { Tokenizer } from "../../models/tokenizer.js";
import type { ConfigView } from "../../workers/config_view.js";
import type { SamplingParams } from "../sampling.js";
import type { SpeculativeStats } from "../speculative.js";
import type { AsyncRolloutServer } from "../../agent_loop/server.js";
import { NamedRegistry } from "../../agent_loop/named_registry.js";

export interface RolloutRequest {
  /** The actor (live weights). */
  model: LlamaModel;
  tokenizer: Tokenizer;
  /** input_ids, attention_mask (+ position_ids), prompts left-padded, one row per prompt. */
  prompts: DataProto;
  params: SamplingParams;
  /** The rank's sampling stream (used when rows carry no seed). */
  rng: Rng;
  /** One seed per prompt row (rollout.seed_per_sample): its samples then do not depend on the batch split. */
  rowSeeds?: number[];
  /**
   * MoE (rollout.enable_rollout_routing_replay): also return routed_experts [B, P+R, sparseLayers, topK],
   * the experts each token was routed to while generating. Only engines with `recordsRouting` can.
   */
  recordRouting?: boolean;
  /**
   * model.mtp.enable_rollout: speculative decoding with the model's MTP layer as the draft; the engine adds
   * its draft counts here. Only engines with `draftsWithMtp` can.
   */
  mtpDraft?: SpeculativeStats;
  /** Drafts per step with mtpDraft (model.mtp.num_speculative_tokens; default 1), chained from the one MTP layer. */
  mtpDraftTokens?: number;
}

/** What a per-request server (agent loops: multi-turn, tools) is built over. */
export interface RequestServerContext {
  /** The actor (live weights); the server re-reads them after each sleep(). */
  model: LlamaModel;
  tokenizer: Tokenizer;
  /** Most requests decoded together (rollout.max_num_seqs, capped by the concurrent loops). */
  maxNumSeqs: number;
  /** Longest prompt + generation of a request (rollout.prompt_length + response_length). */
  maxModelLen: number;
  /** The rank's sampling stream; requests without a seed draw from forks of it. */
  rng: Rng;
  /** MoE (rollout.enable_rollout_routing_replay): every output carries routedExperts; engines that cannot record throw. */
  recordRouting?: boolean;
  /**
   * model.mtp.enable_rollout: decode speculatively with the MTP layer as the draft; the server adds its
   * draft counts here. Only engines with `draftsWithMtp` can.
   */
  mtpDraft?: SpeculativeStats;
  /** Drafts per step with mtpDraft (model.mtp.num_speculative_tokens; default 1), chained from the one MTP layer. */
  mtpDraftTokens?: number;
}

export interface RolloutEngine {
  readonly name: string;
  /** Whether generate can record the experts each token was routed to (RolloutRequest.recordRouting). */
  readonly recordsRouting?: boolean;
  /** Whether generate and requestServer can decode speculatively with the MTP layer as the draft (RolloutRequest.mtpDraft, RequestServerContext.mtpDraft). */
  readonly draftsWithMtp?: boolean;
  generate(req: RolloutRequest): Promise<DataProto>;
  /**
   * Token ids in, token ids out, one request at a time as the agent loops send them:
   * requests join the running batch as they arrive and leave when they stop (continuous
   * batching), and a conversation's cache is kept across its turns where the engine can.
   * An engine without it cannot run agent loops (the worker says so).
   */
  requestServer?(ctx: RequestServerContext): AsyncRolloutServer;
  /** Release what the engine holds (native contexts, weight files). */
  dispose(): Promise<void>;
}

export interface RolloutEngineContext {
  /** actor_rollout_ref.rollout */
  rollout: ConfigView;
  rank: number;
}

export type RolloutEngineFactory = (ctx: RolloutEngineContext) => RolloutEngine;

const engines = new NamedRegistry<RolloutEngineFactory>("rollout engine (actor_rollout_ref.rollout.name)");

/** Register an engine under one or more names. */
export function registerRolloutEngine(names: string | readonly string[], factory: RolloutEngineFactory): void {
  for (const n of typeof names === "string" ? [names] : names) engines.register(n, factory);
}

export function rolloutEngineNames(): string[] {
  return engines.names();
}

/** Build the engine that `actor_rollout_ref.rollout.name` selects. */
export function createRolloutEngine(name: string, ctx: RolloutEngineContext): RolloutEngine {
  return engines.get(name)(ctx);
}

/**
 * An engine's generate honouring rollout.seed_per_sample: without row seeds the whole batch on the
 * rank's stream, with them each prompt row on its own stream (its samples then do not depend on the
 * batch split), one row after the other.
 */
export async function generateSeeded(req: RolloutRequest, gen: (prompts: DataProto, rng: Rng) => DataProto | Promise<DataProto>): Promise<DataProto> {
  const { prompts, rowSeeds } = req;
  if (!rowSeeds) return gen(prompts, req.rng);
  if (rowSeeds.length !== prompts.length) throw new Error(`rollout: ${rowSeeds.length} row seeds for ${prompts.length} prompts`);
  const parts: DataProto[] = [];
  for (let i = 0; i < rowSeeds.length; i++) parts.push(await gen(prompts.slice(i, i + 1), new Rng(rowSeeds[i]!)));
  return DataProto.concat(parts);
}
