// AgentLoopManager: runs one agent loop per row of a batch, concurrently
// (at most rollout.agent.max_concurrent_loops at once), against one rollout
// server, and packs the results in verl's rollout layout. The caller repeats
// rows rollout.n times beforehand, as verl's trainer does.
import type { LlamaModel } from "../models/llama.js";
import type { Tokenizer } from "../models/tokenizer.js";
import type { Rng } from "../utils/rng.js";
import { ContinuousBatchingServer } from "./batching_server.js";
import { DataProto } from "../protocol/data_proto.js";
import { tensor, type TensorData } from "../protocol/tensor.js";
import type { AgentLoopClass } from "./base.js";
import { agentLoopCounters, agentLoopTiming, buildRolloutTensors, extraFieldColumns } from "./postprocess.js";
import { getAgentLoopClass, loadAgentLoopConfig, type AgentLoopSpec } from "./registry.js";
import { AgentLoopResources } from "./resources.js";
import { Semaphore } from "./semaphore.js";
import { checkGenerationParams, RequestAbortedError, type AsyncRolloutServer, type GenerationParams } from "./server.js";
import { resolveAgentLoopSettings, type AgentLoopSettings } from "./settings.js";
import { emptyMetrics, type AgentLoopOutput, type AgentLoopRow } from "./types.js";

export interface AgentLoopManagerOptions {
  /** The trainer config (plain nested object with actor_rollout_ref.rollout, data, ...). */
  config: Record<string, unknown>;
  tokenizer: Tokenizer;
  server: AsyncRolloutServer;
}

export interface GenerateOptions {
  /** Use rollout.val_kwargs sampling (also read from batch.metaInfo.validate). */
  validate?: boolean;
}

/** Non-tensor row fields the built-in loops read; a trainer copies them into the generation batch. */
export const AGENT_LOOP_ROW_KEYS = ["raw_prompt", "agent_name", "tools_kwargs", "interaction_kwargs", "tool_selection", "extra_info", "index", "rollout_seed"] as const;

/** verl's switch: generate through agent loops when rollout.multi_turn.enable is set or a row names its loop. */
export function needsAgentLoop(config: Record<string, unknown>, batch: DataProto): boolean {
  return resolveAgentLoopSettings(config).multiTurn.enable || Array.isArray(batch.nonTensorBatch.agent_name);
}

/** The unpadded prompt of row b from left-padded input_ids + attention_mask. */
function rowPromptIds(inputIds: TensorData, attention: TensorData | undefined, b: number): number[] {
  const T = inputIds.shape[1]!;
  const ids: number[] = [];
  for (let j = 0; j < T; j++) if (!attention || attention.data[b * T + j]) ids.push(inputIds.data[b * T + j]!);
  return ids;
}

export class AgentLoopManager {
  readonly settings: AgentLoopSettings;
  private readonly resources = new AgentLoopResources();
  private yamlLoops: Promise<Map<string, AgentLoopSpec>> | undefined;

  constructor(private readonly opts: AgentLoopManagerOptions) {
    this.settings = resolveAgentLoopSettings(opts.config);
  }

  /**
   * A manager whose server is a ContinuousBatchingServer over `model`: up to
   * min(rollout.max_num_seqs, rollout.agent.max_concurrent_loops) sequences per
   * decode step, contexts up to prompt_length + response_length.
   */
  static fromModel(opts: { config: Record<string, unknown>; model: LlamaModel; tokenizer: Tokenizer; rng: Rng }): AgentLoopManager {
    const s = resolveAgentLoopSettings(opts.config);
    const server = new ContinuousBatchingServer(opts.model, {
      maxNumSeqs: Math.min(s.maxNumSeqs, s.agent.maxConcurrentLoops),
      maxModelLen: s.promptLength + s.responseLength,
      eosTokenIds: [...opts.tokenizer.eosTokenIds],
      rng: opts.rng,
    });
    return new AgentLoopManager({ config: opts.config, tokenizer: opts.tokenizer, server });
  }

  get server(): AsyncRolloutServer {
    return this.opts.server;
  }

  /** verl's sampling params for training or validation. */
  samplingParams(validate: boolean): GenerationParams {
    const s = this.settings;
    const p: GenerationParams = validate
      ? { temperature: s.val.temperature, topP: s.val.topP, topK: s.val.topK, doSample: s.val.doSample, logprobs: s.calculateLogProbs }
      : { temperature: s.temperature, topP: s.topP, topK: s.topK, doSample: s.doSample, logprobs: s.calculateLogProbs };
    checkGenerationParams(p);
    return p;
  }

  private loopsFromYaml(): Promise<Map<string, AgentLoopSpec>> {
    const path = this.settings.agent.agentLoopConfigPath;
    this.yamlLoops ??= path === null
      ? Promise.resolve(new Map())
      : loadAgentLoopConfig(path).then((specs) => new Map(specs.map((s) => [s.name, s])));
    return this.yamlLoops;
  }

  private async resolveLoop(name: string, rowIndex: number): Promise<{ cls: AgentLoopClass; kwargs: Record<string, unknown> }> {
    const spec = (await this.loopsFromYaml()).get(name);
    if (spec) return spec;
    try {
      return { cls: getAgentLoopClass(name), kwargs: {} };
    } catch (e) {
      throw new Error(`row ${rowIndex}: agent_name '${name}': ${(e as Error).message}`);
    }
  }

  async generateSequences(batch: DataProto, opts: GenerateOptions = {}): Promise<DataProto> {
    const validate = opts.validate ?? batch.metaInfo.validate === true;
    const params = this.samplingParams(validate);
    const n = batch.length;
    const names = (batch.nonTensorBatch.agent_name as unknown[] | undefined) ?? [];
    const loops = await Promise.all(
      Array.from({ length: n }, (_, i) => {
        const name = names[i] ?? this.settings.agent.defaultAgentLoop;
        if (typeof name !== "string") throw new Error(`row ${i}: agent_name must be a string, got ${JSON.stringify(name)}`);
        return this.resolveLoop(name, i);
      }),
    );
    const inputIds = batch.batch.input_ids;
    const attention = batch.batch.attention_mask;
    const limiter = new Semaphore(this.settings.agent.maxConcurrentLoops);
    const server = this.opts.server;
    await server.wakeUp?.();
    // verl's over_sample_rate (training only): once int(n * (1 - rate)) rows finished, the rest are
    // aborted and padded (an empty response, response_mask 0), so stragglers do not hold up the step.
    const target = validate ? n : Math.trunc(n * (1 - this.settings.overSampleRate));
    let finished = 0, aborted = false;
    const gated: AsyncRolloutServer = {
      generate: (id, prompt, p) => (aborted ? Promise.reject(new RequestAbortedError()) : server.generate(id, prompt, p)),
    };
    const runRow = async (cls: AgentLoopClass, kwargs: Record<string, unknown>, i: number): Promise<AgentLoopOutput | null> => {
      if (aborted) return null;
      try {
        const out = await this.runOne(cls, kwargs, params, this.row(batch, i, inputIds, attention), gated);
        if (aborted) return null;
        if (++finished >= target && target < n) {
          aborted = true;
          server.abort?.();
        }
        return out;
      } catch (e) {
        if (aborted) return null;
        throw e;
      }
    };
    const start = performance.now();
    let settled: PromiseSettledResult<AgentLoopOutput | null>[];
    try {
      settled = await Promise.allSettled(loops.map(({ cls, kwargs }, i) => limiter.run(() => runRow(cls, kwargs, i))));
    } finally {
      // The trainer changes the weights before the next batch: let the server re-read them.
      await this.opts.server.sleep?.();
    }
    const failed = settled.findIndex((s) => s.status === "rejected");
    if (failed >= 0) {
      const reason = (settled[failed] as PromiseRejectedResult).reason as unknown;
      const msg = reason instanceof Error ? reason.message : String(reason);
      throw new Error(`agent loop for row ${failed} failed: ${msg}`, { cause: reason });
    }
    const results = settled.map((s) => (s as PromiseFulfilledResult<AgentLoopOutput | null>).value);
    const outputs = results.map((o, i) => o ?? this.abortedRow(this.row(batch, i, inputIds, attention), results));
    return this.pack(outputs, batch, (performance.now() - start) / 1000);
  }

  /**
   * An aborted row (over_sample_rate): its prompt and an empty response, so it adds nothing to
   * the policy loss; log-probs and a reward of 0 where the finished rows have them, so the batch keeps its columns.
   */
  private abortedRow(row: AgentLoopRow, results: (AgentLoopOutput | null)[]): AgentLoopOutput {
    const done = results.filter((o): o is AgentLoopOutput => o !== null);
    return {
      promptIds: row.promptIds ?? [],
      responseIds: [], responseMask: [],
      responseLogprobs: done.length > 0 && done.every((o) => o.responseLogprobs) ? [] : null,
      routedExperts: done.length > 0 && done.every((o) => o.routedExperts) ? tensor(new Int32Array(0), [0, ...done[0]!.routedExperts!.shape.slice(1)], "int32") : null,
      rewardScore: done.length > 0 && done.every((o) => typeof o.rewardScore === "number") ? 0 : null,
      numTurns: 1,
      metrics: emptyMetrics(),
      extraFields: {},
    };
  }

  private row(batch: DataProto, i: number, inputIds: TensorData | undefined, attention: TensorData | undefined): AgentLoopRow {
    const fields: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(batch.nonTensorBatch)) fields[k] = v[i];
    return { index: i, fields, promptIds: inputIds ? rowPromptIds(inputIds, attention, i) : undefined };
  }

  private async runOne(cls: AgentLoopClass, kwargs: Record<string, unknown>, params: GenerationParams, row: AgentLoopRow, server: AsyncRolloutServer): Promise<AgentLoopOutput> {
    const { config, tokenizer } = this.opts;
    const loop = new cls({ config, settings: this.settings, server, tokenizer, resources: this.resources, kwargs });
    return loop.run(params, row);
  }

  private pack(outputs: AgentLoopOutput[], batch: DataProto, wallSeconds: number): DataProto {
    const s = this.settings;
    const tensors = buildRolloutTensors(outputs, { promptLength: s.promptLength, responseLength: s.responseLength, padTokenId: this.opts.tokenizer.padTokenId });
    const nonTensor: Record<string, unknown[]> = {
      __num_turns__: outputs.map((o) => o.numTurns),
      ...extraFieldColumns(outputs),
    };
    // verl carries raw_prompt through as an extra field.
    if (batch.nonTensorBatch.raw_prompt) nonTensor.raw_prompt = batch.nonTensorBatch.raw_prompt;
    const timing = agentLoopTiming(outputs, tensors.attention_mask!, s.promptLength);
    const metrics: Record<string, number> = { ...agentLoopCounters(outputs), "agent_loop/wall_seconds": wallSeconds };
    const meta: Record<string, unknown> = { timing, metrics };
    if (tensors.rm_scores) meta.reward_extra_keys = [];
    return DataProto.fromDict(tensors, nonTensor, meta);
  }
}
