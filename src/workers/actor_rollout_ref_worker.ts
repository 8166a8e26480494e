// verl's ActorRolloutRefWorker for one rank: the actor (trained), the rollout
// (generation with the actor's live weights: the same variables, no copy), and
// the reference policy (a frozen copy of the initial weights, only when a KL
// term needs it). Methods keep verl's names and dispatch modes.
import { readMixedPrecision, withMatmulPrecision, type MixedPrecision } from "../engine/webgpu_kernels.js";
import * as tf from "@tensorflow/tfjs";
import type { Config } from "../config/index.js";
import { LlamaModel, type Tokenizer } from "../models/index.js";
import { familyOfConfig } from "../models/config.js";
import { DataProto } from "../protocol/index.js";
import { createRolloutEngine, type RolloutEngine, type SamplingParams } from "../rollout/index.js";
import { readRolloutQuantization, setRolloutQuantization } from "../rollout/fp8.js";
import type { SpeculativeStats } from "../rollout/speculative.js";
import { AgentLoopManager, needsAgentLoop, resolveAgentLoopSettings } from "../agent_loop/index.js";
import { Dispatch, onThreadClose, register, Worker } from "../single_controller/index.js";
import { Rng } from "../utils/rng.js";
import { DataParallelPPOActor } from "./actor/dp_actor.js";
import type { MicroBatchSpec } from "./batching.js";
import { loadRoleCheckpoint, saveRoleCheckpoint, type SaveOptions } from "./checkpoint.js";
import type { ConfigView } from "./config_view.js";
import { DataParallelOptimizer } from "./dp_optimizer.js";
import { roleOptimizerShards } from "./optimizer_sharding.js";
import { loadModelTokenizer, loadPolicy } from "./model_source.js";
import { readMtpSettings } from "./mtp_settings.js";
import { checkRolloutFitsModel } from "./rollout_length.js";
import { applyModelMemoryOptions, readModelMemoryOptions } from "./model_options.js";
import { globalTokenNum, inferenceSpec, setupWorker } from "./worker_setup.js";
import { isBypassMode } from "../trainer/ppo/rollout_corr.js";
import { FlopsCounter } from "../utils/flops_counter.js";
import { logger } from "../utils/logger.js";
import { memoryMetrics, trainingDeviceName } from "../utils/perf_metrics.js";

/** actor_rollout_ref (all three), actor_rollout (no reference), ref (reference only). */
export type ActorRole = "actor_rollout_ref" | "actor_rollout" | "ref";
const ROLES: readonly ActorRole[] = ["actor_rollout_ref", "actor_rollout", "ref"];

interface ActorState {
  cfg: ConfigView;
  tokenizer: Tokenizer;
  actor?: DataParallelPPOActor;
  model?: LlamaModel;
  optimizer?: DataParallelOptimizer;
  ref?: DataParallelPPOActor;
  /** Sampling randomness of this rank for training rollouts (saved in checkpoints). */
  rolloutRng: Rng;
  seed: number;
  logProbSpec: MicroBatchSpec;
  refLogProbSpec?: MicroBatchSpec;
  /** Multi-turn / tool rollouts: agent loops on a continuous-batching server over the actor's weights. */
  agentLoops?: AgentLoopManager;
  /** The training agent loops' MTP draft counts (model.mtp.enable_rollout), reset each batch */
  agentLoopDraft?: SpeculativeStats;
  /** The engine rollout.name selects (the host decoder, llama_cpp, or a registered one). */
  rolloutEngine?: RolloutEngine;
  /** The tfjs backend of this rank (for perf/ memory metrics). */
  backend: string;
  /** perf/mfu/actor (an actor role only). */
  flops?: FlopsCounter;
  /** MoE routing replay: actor.router_replay.mode, and whether the rollout records routed_experts. */
  routerReplay: RouterReplayMode;
  rolloutRouting: boolean;
  /** model.mtp.enable_rollout: rollouts (single-turn and agent loops) decode speculatively with the MTP layer as the draft. */
  mtpRollout: boolean;
  /** model.mtp.num_speculative_tokens: drafts per step */
  mtpDraftTokens: number;
}

/** verl's actor.router_replay.mode: R2 records in the old-log-prob pass, R3 replays the rollout's routing there too; both replay in the update. */
export const ROUTER_REPLAY_MODES = ["disabled", "R2", "R3"] as const;
export type RouterReplayMode = (typeof ROUTER_REPLAY_MODES)[number];

const MODE_KEY = "actor_rollout_ref.actor.router_replay.mode", ROLLOUT_KEY = "actor_rollout_ref.rollout.enable_rollout_routing_replay";

/**
 * The routing-replay settings, checked against the model and the rollout engine (verl reads the
 * actor's router_replay only; the reference policy routes on its own).
 */
export function routerReplaySettings(cfg: ConfigView, model: LlamaModel, engine: RolloutEngine | undefined, bypass: boolean): { mode: RouterReplayMode; rollout: boolean } {
  const raw = cfg.str(MODE_KEY, "disabled");
  if (!(ROUTER_REPLAY_MODES as readonly string[]).includes(raw)) throw new Error(`${MODE_KEY}=${raw}: must be one of ${ROUTER_REPLAY_MODES.join(", ")}`);
  const mode = raw as RouterReplayMode, rollout = cfg.bool(ROLLOUT_KEY, false);
  if (mode === "disabled" && !rollout) return { mode, rollout };
  const what = mode !== "disabled" ? `${MODE_KEY}=${mode}` : `${ROLLOUT_KEY}=True`;
  if (!model.config.moe) throw new Error(`${what}: the model has no routed experts (model_type ${familyOfConfig(model.config)}); router replay needs a MoE model such as qwen3_moe`);
  if (mode === "R3" && !rollout) throw new Error(`${MODE_KEY}=R3 replays the rollout's routing: set ${ROLLOUT_KEY}=True so the rollout records it`);
  if (mode === "R2" && bypass) throw new Error(`${MODE_KEY}=R2 records the routing in the old-log-prob pass, which algorithm.rollout_correction.bypass_mode skips: use R3 (with ${ROLLOUT_KEY}=True) or turn bypass_mode off`);
  if (rollout && engine && !engine.recordsRouting) {
    throw new Error(`${ROLLOUT_KEY}=True: rollout engine '${engine.name}' (actor_rollout_ref.rollout.name=${cfg.str("actor_rollout_ref.rollout.name", "tfjs")}) cannot record the experts each token is routed to; the host decoder (rollout.name=tfjs, or vllm/sglang) can`);
  }
  return { mode, rollout };
}

/** A frozen copy of a model's weights (the reference policy). */
function frozenCopy(model: LlamaModel): LlamaModel {
  const params = new Map<string, tf.Variable>();
  for (const [name, v] of model.params) params.set(name, tf.variable(v, false, `ref/${v.name}`));
  return new LlamaModel(model.config, params, { lmHead: model.hasLmHead });
}

export class ActorRolloutRefWorker extends Worker {
  private s: ActorState | undefined;

  constructor(private readonly config: Config, readonly role: ActorRole = "actor_rollout_ref") {
    super();
    if (!ROLES.includes(role)) throw new Error(`ActorRolloutRefWorker: role must be one of ${ROLES.join(", ")}, got '${role}'`);
  }

  private get state(): ActorState {
    if (!this.s) throw new Error(`${this.role} worker rank ${this.rank}: call initModel first`);
    return this.s;
  }

  get hasActor(): boolean {
    return this.role !== "ref";
  }

  get hasRef(): boolean {
    return this.role !== "actor_rollout";
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async initModel(): Promise<{ backend: string; numParams: number }> {
    const common = await setupWorker(this.config, ["actor_rollout_ref.model.external_lib"]);
    const { cfg, plan, seed } = common;
    const modelCfg = cfg.at("actor_rollout_ref.model");
    const actorCfg = cfg.at("actor_rollout_ref.actor");
    const tokenizer = await loadModelTokenizer(modelCfg);
    const model = await loadPolicy(modelCfg, tokenizer, seed);
    const memory = readModelMemoryOptions(modelCfg);
    // LoRA and checkpointing shape the actor's training; a reference-only worker runs the plain base model
    if (this.hasActor) applyModelMemoryOptions(model, memory, modelCfg, seed);
    if (model.config.vocabSize < tokenizer.vocabSize) {
      throw new Error(`actor_rollout_ref.model: the model's vocabulary (${model.config.vocabSize}) is smaller than the tokenizer's (${tokenizer.vocabSize})`);
    }
    const world = this.worldSize;
    const rolloutCfg = cfg.at("actor_rollout_ref.rollout");
    if (this.hasActor) checkRolloutFitsModel(rolloutCfg, model.config);
    const mtp = readMtpSettings(modelCfg);
    const state: ActorState = {
      cfg, tokenizer, backend: common.backend,
      rolloutRng: new Rng(seed + 7919 * (this.rank + 1)), seed, routerReplay: "disabled", rolloutRouting: false, mtpRollout: false, mtpDraftTokens: mtp.draftTokens,
      logProbSpec: inferenceSpec(rolloutCfg, "log_prob_", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu", world),
    };
    const rollCorr = cfg.section("algorithm.rollout_correction");
    const actorOpts = {
      config: actorCfg, miniBatchPerRank: plan.actorMiniBatchPerRank, microBatchPerRank: plan.actorMicroBatchPerRank, removePadding: memory.removePadding,
      ...(isBypassMode(rollCorr) ? { bypassRolloutCorrection: rollCorr } : {}),
    };
    // the MTP loss joins the actor's update only (old and reference log-probs are the trunk's alone)
    const mtpTrain = mtp.enableTrain ? { mtpTrain: { scale: mtp.lossScalingFactor, detachEncoder: mtp.detachEncoder } } : {};
    const engine = this.hasActor ? createRolloutEngine(rolloutCfg.str("name", "tfjs"), { rollout: rolloutCfg, rank: this.rank }) : undefined;
    if (engine) onThreadClose(() => engine.dispose());
    if (this.hasActor && mtp.enableRollout) {
      if (!engine?.draftsWithMtp) throw new Error(`${modelCfg.key("mtp.enable_rollout")}=true: rollout engine '${engine?.name}' (actor_rollout_ref.rollout.name) cannot draft with the MTP layer; the host decoder (tfjs, hf, naive, vllm, sglang) can`);
      state.mtpRollout = true;
    }
    if (this.hasActor) {
      const rr = routerReplaySettings(cfg, model, engine, isBypassMode(rollCorr));
      state.routerReplay = rr.mode;
      state.rolloutRouting = rr.rollout;
    }
    if (this.hasRef) {
      // under LoRA the reference policy is the base model with the adapter off (verl's disable_adapter): no copy
      const refModel = !this.hasActor ? model : model.lora ? model.withoutAdapter() : frozenCopy(model);
      state.ref = new DataParallelPPOActor(refModel, null, { ...actorOpts, seed });
      state.refLogProbSpec = inferenceSpec(cfg.at("actor_rollout_ref.ref"), "log_prob_", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu", world);
    }
    if (this.hasActor) {
      const totalSteps = actorCfg.int("optim.total_training_steps", -1);
      const optimizer = new DataParallelOptimizer(
        model.trainableVariables(), actorCfg.at("optim"), Math.max(totalSteps, 0), this.collective, actorCfg.optNum("grad_clip"),
        { shards: roleOptimizerShards(actorCfg, "fsdp_config", this.worldSize) },
      );
      state.model = model;
      state.optimizer = optimizer;
      state.actor = new DataParallelPPOActor(model, optimizer, { ...actorOpts, ...mtpTrain, seed: seed + this.rank, replayRouting: state.routerReplay !== "disabled" });
      state.flops = new FlopsCounter(model.config, trainingDeviceName(common.backend), this.rank === 0 ? (line) => logger().warn(line) : undefined);
      state.rolloutEngine = engine;
      // rollout.quantization=fp8|torchao: the decoders quantize the actor's linear weights at each weight sync (rollout/fp8.ts, rollout/torchao.ts)
      setRolloutQuantization(model, readRolloutQuantization(rolloutCfg, this.rank === 0 ? (line) => logger().warn(line) : undefined));
    }
    this.s = state;
    return { backend: common.backend, numParams: model.trainableVariables().reduce((a, v) => a + v.size, 0) };
  }

  private requireActor(method: string): { actor: DataParallelPPOActor; model: LlamaModel; optimizer: DataParallelOptimizer } {
    const s = this.state;
    if (!s.actor || !s.model || !s.optimizer) throw new Error(`${method}: this worker's role '${this.role}' holds no actor`);
    return { actor: s.actor, model: s.model, optimizer: s.optimizer };
  }

  /** Sampling settings from rollout (or rollout.val_kwargs when meta validate is set). */
  private samplingParams(meta: Record<string, unknown>): SamplingParams {
    const r = this.state.cfg.at("actor_rollout_ref.rollout");
    const tok = this.state.tokenizer;
    const validate = meta.validate === true;
    const src = validate ? r.at("val_kwargs") : r;
    const params: SamplingParams = {
      temperature: src.num("temperature", 1.0),
      topK: src.int("top_k", -1),
      topP: src.num("top_p", 1.0),
      doSample: src.bool("do_sample", true),
      responseLength: r.int("response_length"),
      eosTokenIds: [...tok.eosTokenIds],
      padTokenId: tok.padTokenId,
      calculateLogProbs: r.bool("calculate_log_probs", false),
      ignoreEos: r.bool("ignore_eos", false),
    };
    if (meta.do_sample === false) params.doSample = false;
    return params;
  }

  /**
   * Responses for left-padded prompts (input_ids, attention_mask, position_ids), from the
   * engine rollout.name selects. Rows that carry a `rollout_seed` (rollout.seed_per_sample)
   * are sampled from their own stream, so the samples do not depend on how the batch is
   * split over ranks.
   */
  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async generateSequences(prompts: DataProto): Promise<DataProto> {
    const { model } = this.requireActor("generateSequences");
    const engine = this.state.rolloutEngine!;
    const rng = this.samplingRng(prompts.metaInfo);
    if (needsAgentLoop(this.config, prompts)) return this.generateWithAgentLoops(model, engine, prompts, rng);
    const params = this.samplingParams(prompts.metaInfo);
    const gen = prompts.select(["input_ids", "attention_mask", "position_ids"].filter((k) => k in prompts.batch), [], []);
    const seeds = prompts.nonTensorBatch.rollout_seed;
    const rowSeeds = seeds?.map((seed, i) => {
      if (typeof seed !== "number") throw new Error(`generateSequences: rollout_seed at row ${i} must be a number`);
      return seed;
    });
    // validation rollouts train nothing: their routing is not recorded
    const recordRouting = this.state.rolloutRouting && prompts.metaInfo.validate !== true;
    const mtpDraft = this.state.mtpRollout ? { drafted: 0, accepted: 0 } : undefined;
    const out = await engine.generate({ model, tokenizer: this.state.tokenizer, prompts: gen, params, rng, rowSeeds, ...(recordRouting ? { recordRouting } : {}), ...(mtpDraft ? { mtpDraft, mtpDraftTokens: this.state.mtpDraftTokens } : {}) });
    if (recordRouting && !out.batch.routed_experts) throw new Error(`${ROLLOUT_KEY}=True: rollout engine '${engine.name}' returned no routed_experts`);
    // the share of MTP drafts the trunk accepted (vLLM logs it as its draft acceptance rate)
    if (mtpDraft && mtpDraft.drafted > 0) return new DataProto(out.batch, {}, { metrics: { "rollout/mtp_acceptance_rate": [mtpDraft.accepted / mtpDraft.drafted] } });
    return new DataProto(out.batch, {}, {});
  }

  /**
   * Training rollouts draw from the rank's saved stream. Validation draws from a stream of its
   * own, fixed by (seed, rank, step), so validating (also before training, after a resume)
   * never shifts the training samples and gives the same numbers on a resumed run.
   */
  private samplingRng(meta: Record<string, unknown>): Rng {
    if (meta.validate !== true) return this.state.rolloutRng;
    const step = typeof meta.global_steps === "number" ? meta.global_steps : 0;
    return new Rng((this.state.seed ^ Math.imul(this.rank + 1, 0x85ebca6b) ^ Math.imul(step + 1, 0x9e3779b1)) >>> 0);
  }

  /**
   * verl's agent-loop rollout (rollout.multi_turn.enable, or rows naming an agent_name): each
   * row runs its loop (single turn, tool calls, a simulated user) against a batching server
   * that reads the actor's current weights; tool tokens are 0 in response_mask.
   */
  private async generateWithAgentLoops(model: LlamaModel, engine: RolloutEngine, prompts: DataProto, rng: Rng): Promise<DataProto> {
    const s = this.state;
    // the training server records the routing (rollout routing replay); validation trains nothing
    const training = rng === s.rolloutRng;
    // model.mtp.enable_rollout: the server adds its draft counts here (the training server lives on: its counts restart each batch)
    const mtpDraft = s.mtpRollout ? (training ? (s.agentLoopDraft ??= { drafted: 0, accepted: 0 }) : { drafted: 0, accepted: 0 }) : undefined;
    const build = () => {
      const name = s.cfg.str("actor_rollout_ref.rollout.name", "tfjs");
      if (!engine.requestServer) {
        throw new Error(`actor_rollout_ref.rollout.name=${name}: rollout engine '${engine.name}' has no per-request interface (requestServer), which agent-loop (multi-turn) rollouts need`);
      }
      const a = resolveAgentLoopSettings(this.config);
      const server = engine.requestServer({
        model, tokenizer: s.tokenizer, rng,
        maxNumSeqs: Math.min(a.maxNumSeqs, a.agent.maxConcurrentLoops),
        maxModelLen: a.promptLength + a.responseLength,
        ...(training && s.rolloutRouting ? { recordRouting: true } : {}),
        ...(mtpDraft ? { mtpDraft, mtpDraftTokens: s.mtpDraftTokens } : {}),
      });
      return new AgentLoopManager({ config: this.config, tokenizer: s.tokenizer, server });
    };
    // The training manager lives on (its server forks the saved stream); validation gets a fresh one.
    const manager = training ? (s.agentLoops ??= build()) : build();
    if (mtpDraft) { mtpDraft.drafted = 0; mtpDraft.accepted = 0; }
    const out = await manager.generateSequences(prompts);
    if (training && s.rolloutRouting && !out.batch.routed_experts) throw new Error(`${ROLLOUT_KEY}=True: the agent loops returned no routed_experts (every row's loop must pass its server output's routedExperts on)`);
    // Per-rank timing cannot merge across ranks; the metrics can (lists, reduced by the driver).
    const nonTensor = Object.fromEntries(Object.entries(out.nonTensorBatch).filter(([k]) => k !== "raw_prompt"));
    let metrics = out.metaInfo.metrics as Record<string, number> | undefined;
    // the share of MTP drafts the trunk accepted, as single-turn rollouts report it
    if (mtpDraft && mtpDraft.drafted > 0) metrics = { ...metrics, "rollout/mtp_acceptance_rate": mtpDraft.accepted / mtpDraft.drafted };
    return new DataProto(out.batch, nonTensor, metrics ? { metrics: Object.fromEntries(Object.entries(metrics).map(([k, v]) => [k, [v]])) } : {});
  }

  /** verl's fsdp_config.mixed_precision of the actor or the reference policy (16-bit matrix products on WebGPU). */
  private precision(section: "actor" | "ref"): MixedPrecision {
    return readMixedPrecision((k) => this.state.cfg.optStr(k), `actor_rollout_ref.${section}`);
  }

  /** old_log_probs (and entropys; sum_pi_squared with actor.calculate_sum_pi_squared) under the current actor. */
  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async computeLogProb(data: DataProto): Promise<DataProto> {
    const { actor } = this.requireActor("computeLogProb");
    const temperature = this.temperatureOf(data);
    const calc = data.metaInfo.calculate_entropy !== false;
    const spp = this.state.cfg.bool("actor_rollout_ref.actor.calculate_sum_pi_squared", false);
    const t0 = performance.now();
    // routing replay: R2 records the experts this pass chooses, R3 replays the rollout's
    const mode = this.state.routerReplay;
    if (mode === "R3") this.requireRouted(data, "the old-log-prob pass");
    const routing = { record: mode === "R2", replay: mode === "R3" };
    const r = await withMatmulPrecision(this.precision("actor"), () => actor.computeLogProb(data, this.state.logProbSpec, temperature, calc, spp, routing));
    const seconds = (performance.now() - t0) / 1000;
    const out = {
      old_log_probs: r.logProbs, ...(r.entropy ? { entropys: r.entropy } : {}), ...(r.sumPiSquared ? { sum_pi_squared: r.sumPiSquared } : {}),
      ...(r.routedExperts ? { routed_experts: r.routedExperts } : {}),
    };
    // verl's engine workers: a forward-only pass is a third of the training FLOPs (perf/mfu/actor_infer)
    const seqlens = globalTokenNum(data);
    const metrics = seqlens ? { "perf/mfu/actor_infer": [this.state.flops!.mfu(seqlens, seconds, { worldSize: this.worldSize, forwardOnly: true })] } : undefined;
    return new DataProto(out, {}, metrics ? { temperature, metrics } : { temperature });
  }

  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async computeRefLogProb(data: DataProto): Promise<DataProto> {
    const s = this.state;
    if (!s.ref || !s.refLogProbSpec) throw new Error(`computeRefLogProb: role '${this.role}' holds no reference policy (no KL term is on)`);
    const r = await withMatmulPrecision(this.precision("ref"), () => s.ref!.computeLogProb(data, s.refLogProbSpec!, this.temperatureOf(data), false));
    return new DataProto({ ref_log_prob: r.logProbs }, {}, {});
  }

  @register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO })
  async updateActor(data: DataProto): Promise<DataProto> {
    const { actor, optimizer } = this.requireActor("updateActor");
    if (this.state.routerReplay !== "disabled") this.requireRouted(data, "the update");
    const lr = optimizer.lr;
    const t0 = performance.now();
    const metrics = await withMatmulPrecision(this.precision("actor"), () => actor.updatePolicy(data));
    const seconds = (performance.now() - t0) / 1000;
    // verl: the whole batch's tokens (global_token_num) over this rank's update time, x ppo_epochs, / world size
    const seqlens = globalTokenNum(data);
    const epochs = this.state.cfg.int("actor_rollout_ref.actor.ppo_epochs", 1);
    if (seqlens) metrics["perf/mfu/actor"] = [this.state.flops!.mfu(seqlens, seconds, { passes: epochs, worldSize: this.worldSize })];
    for (const [k, v] of Object.entries(memoryMetrics(this.state.backend))) metrics[k] = [v];
    metrics["actor/lr"] = [lr];
    optimizer.scheduler.step();
    return new DataProto({}, {}, { metrics });
  }

  /** Routing replay needs the batch's routed_experts: say which key records them when they are missing. */
  private requireRouted(data: DataProto, pass: string): void {
    if (data.batch.routed_experts) return;
    const mode = this.state.routerReplay;
    const from = mode === "R3" ? `the rollout records them with ${ROLLOUT_KEY}=True` : "the old-log-prob pass records them (R2)";
    throw new Error(`${MODE_KEY}=${mode}: ${pass} replays the batch's routed_experts, and the batch has none (${from})`);
  }

  private temperatureOf(data: DataProto): number {
    const t = data.metaInfo.temperature;
    if (typeof t === "number" && t > 0) return t;
    return this.state.cfg.num("actor_rollout_ref.rollout.temperature", 1.0) || 1.0;
  }

  /** Writes actor/ under `dir` (weights, optimizer, scheduler + RNG per rank, HF export on rank 0). */
  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async saveCheckpoint(dir: string, opts: SaveOptions = {}): Promise<void> {
    const { actor, model, optimizer } = this.requireActor("saveCheckpoint");
    await saveRoleCheckpoint(dir, {
      rank: this.rank, worldSize: this.worldSize, params: model.trainableParams(), optimizer,
      rngs: { rollout: this.state.rolloutRng, actor: actor.rng },
      hf: { model, tokenizer: this.state.tokenizer },
    }, opts);
  }

  @register({ dispatchMode: Dispatch.ONE_TO_ALL })
  async loadCheckpoint(dir: string): Promise<void> {
    const { actor, model, optimizer } = this.requireActor("loadCheckpoint");
    await loadRoleCheckpoint(dir, {
      rank: this.rank, worldSize: this.worldSize, params: model.trainableParams(), optimizer,
      rngs: { rollout: this.state.rolloutRng, actor: actor.rng },
    });
  }
}
