// The rollout keys the agent loops read, parsed once from the trainer config
// into a typed object. Keys and defaults are verl's
// (actor_rollout_ref.rollout.{multi_turn,agent,...}); a wrong type is an error
// naming the key.

export type TruncateSide = "left" | "right" | "middle";

export interface AgentLoopSettings {
  promptLength: number;
  responseLength: number;
  temperature: number;
  topP: number;
  topK: number;
  doSample: boolean;
  calculateLogProbs: boolean;
  val: { temperature: number; topP: number; topK: number; doSample: boolean };
  multiTurn: {
    enable: boolean;
    maxAssistantTurns: number | null;
    maxUserTurns: number | null;
    maxParallelCalls: number;
    maxToolResponseLength: number;
    toolResponseTruncateSide: TruncateSide;
    toolConfigPath: string | null;
    interactionConfigPath: string | null;
    format: string;
  };
  agent: { defaultAgentLoop: string; agentLoopConfigPath: string | null; maxConcurrentLoops: number };
  /** data.tool_config_path: tool schemas rendered into single-turn prompts. */
  dataToolConfigPath: string | null;
  /** data.apply_chat_template_kwargs: extra template variables. */
  applyChatTemplateKwargs: Record<string, unknown>;
  /** rollout.max_num_seqs: how many sequences the batching server decodes at once. */
  maxNumSeqs: number;
  freeCacheEngine: boolean;
  /** rollout.over_sample_rate: training batches stop once (1 - rate) of their requests finished. */
  overSampleRate: number;
}

const ROLLOUT = "actor_rollout_ref.rollout";

function lookup(cfg: unknown, path: string): unknown {
  let cur: unknown = cfg;
  for (const part of path.split(".")) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<string, unknown>)[part];
  }
  return cur;
}

function num(cfg: unknown, path: string, dflt: number): number {
  const v = lookup(cfg, path);
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new Error(`config key ${path} must be a number, got ${JSON.stringify(v)}`);
  return v;
}

function int(cfg: unknown, path: string, dflt: number, min = 0): number {
  const v = num(cfg, path, dflt);
  if (!Number.isInteger(v) || v < min) throw new Error(`config key ${path} must be an integer >= ${min}, got ${v}`);
  return v;
}

function optInt(cfg: unknown, path: string): number | null {
  const v = lookup(cfg, path);
  if (v === undefined || v === null) return null;
  return int(cfg, path, 0);
}

function bool(cfg: unknown, path: string, dflt: boolean): boolean {
  const v = lookup(cfg, path);
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "boolean") throw new Error(`config key ${path} must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

function str(cfg: unknown, path: string, dflt: string): string {
  const v = lookup(cfg, path);
  if (v === undefined || v === null) return dflt;
  if (typeof v !== "string") throw new Error(`config key ${path} must be a string, got ${JSON.stringify(v)}`);
  return v;
}

function optStr(cfg: unknown, path: string): string | null {
  const v = lookup(cfg, path);
  if (v === undefined || v === null || v === "") return null;
  return str(cfg, path, "");
}

/** Read the agent-loop settings from a trainer config (plain nested object). */
export function resolveAgentLoopSettings(cfg: unknown): AgentLoopSettings {
  const promptLength = int(cfg, `${ROLLOUT}.prompt_length`, num(cfg, "data.max_prompt_length", 512), 1);
  const responseLength = int(cfg, `${ROLLOUT}.response_length`, num(cfg, "data.max_response_length", 512), 1);
  const side = str(cfg, `${ROLLOUT}.multi_turn.tool_response_truncate_side`, "middle");
  if (side !== "left" && side !== "right" && side !== "middle") {
    throw new Error(`config key ${ROLLOUT}.multi_turn.tool_response_truncate_side must be left, right or middle, got '${side}'`);
  }
  const kwargs = lookup(cfg, "data.apply_chat_template_kwargs");
  if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== "object" || Array.isArray(kwargs))) {
    throw new Error(`config key data.apply_chat_template_kwargs must be a mapping, got ${JSON.stringify(kwargs)}`);
  }
  const overSampleRate = num(cfg, `${ROLLOUT}.over_sample_rate`, 0);
  if (!(overSampleRate >= 0 && overSampleRate < 1)) throw new Error(`config key ${ROLLOUT}.over_sample_rate must be in [0, 1), got ${overSampleRate}`);
  return {
    promptLength,
    responseLength,
    overSampleRate,
    temperature: num(cfg, `${ROLLOUT}.temperature`, 1.0),
    topP: num(cfg, `${ROLLOUT}.top_p`, 1.0),
    topK: int(cfg, `${ROLLOUT}.top_k`, -1, -1),
    doSample: bool(cfg, `${ROLLOUT}.do_sample`, true),
    calculateLogProbs: bool(cfg, `${ROLLOUT}.calculate_log_probs`, false),
    val: {
      temperature: num(cfg, `${ROLLOUT}.val_kwargs.temperature`, 0),
      topP: num(cfg, `${ROLLOUT}.val_kwargs.top_p`, 1.0),
      topK: int(cfg, `${ROLLOUT}.val_kwargs.top_k`, -1, -1),
      doSample: bool(cfg, `${ROLLOUT}.val_kwargs.do_sample`, false),
    },
    multiTurn: {
      enable: bool(cfg, `${ROLLOUT}.multi_turn.enable`, false),
      maxAssistantTurns: optInt(cfg, `${ROLLOUT}.multi_turn.max_assistant_turns`),
      maxUserTurns: optInt(cfg, `${ROLLOUT}.multi_turn.max_user_turns`),
      maxParallelCalls: int(cfg, `${ROLLOUT}.multi_turn.max_parallel_calls`, 1, 1),
      maxToolResponseLength: int(cfg, `${ROLLOUT}.multi_turn.max_tool_response_length`, 256, 1),
      toolResponseTruncateSide: side,
      toolConfigPath: optStr(cfg, `${ROLLOUT}.multi_turn.tool_config_path`),
      interactionConfigPath: optStr(cfg, `${ROLLOUT}.multi_turn.interaction_config_path`),
      format: str(cfg, `${ROLLOUT}.multi_turn.format`, "hermes"),
    },
    agent: {
      defaultAgentLoop: str(cfg, `${ROLLOUT}.agent.default_agent_loop`, "single_turn_agent"),
      agentLoopConfigPath: optStr(cfg, `${ROLLOUT}.agent.agent_loop_config_path`),
      maxConcurrentLoops: int(cfg, `${ROLLOUT}.agent.max_concurrent_loops`, 64, 1),
    },
    dataToolConfigPath: optStr(cfg, "data.tool_config_path"),
    applyChatTemplateKwargs: (kwargs as Record<string, unknown> | undefined) ?? {},
    maxNumSeqs: int(cfg, `${ROLLOUT}.max_num_seqs`, 256, 1),
    freeCacheEngine: bool(cfg, `${ROLLOUT}.free_cache_engine`, true),
  };
}
