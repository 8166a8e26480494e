// Agent-loop outputs -> verl's rollout batch layout:
//   prompts        [B, P]   left-padded        responses     [B, R] right-padded
//   response_mask  [B, R]   1 = model token (0 for tool/user tokens and padding)
//   input_ids / attention_mask / position_ids [B, P+R]
//   rollout_log_probs [B, R] (when every row has log-probs), rm_scores [B, R] (when every row has a reward)
import { tensor, type TensorData } from "../protocol/tensor.js";
import type { AgentLoopOutput } from "./types.js";

export interface PostprocessOptions {
  promptLength: number;
  responseLength: number;
  padTokenId: number;
}

export function buildRolloutTensors(outputs: AgentLoopOutput[], opts: PostprocessOptions): Record<string, TensorData> {
  const { promptLength: P, responseLength: R, padTokenId } = opts;
  const B = outputs.length;
  const T = P + R;
  const prompts = new Int32Array(B * P).fill(padTokenId);
  const responses = new Int32Array(B * R).fill(padTokenId);
  const responseMask = new Int32Array(B * R);
  const inputIds = new Int32Array(B * T);
  const attention = new Int32Array(B * T);
  const positions = new Int32Array(B * T);
  const withLogprobs = B > 0 && outputs.every((o) => o.responseLogprobs);
  const logprobs = withLogprobs ? new Float32Array(B * R) : undefined;
  const withScores = B > 0 && outputs.every((o) => typeof o.rewardScore === "number");
  const scores = withScores ? new Float32Array(B * R) : undefined;

  outputs.forEach((o, b) => {
    const np = o.promptIds.length, nr = o.responseIds.length;
    if (np > P) throw new Error(`row ${b}: prompt has ${np} tokens, more than rollout.prompt_length=${P}`);
    if (nr > R) throw new Error(`row ${b}: response has ${nr} tokens, more than rollout.response_length=${R}`);
    if (o.responseMask.length !== nr) throw new Error(`row ${b}: response_mask has ${o.responseMask.length} entries for ${nr} response tokens`);
    prompts.set(o.promptIds, b * P + (P - np));
    responses.set(o.responseIds, b * R);
    responseMask.set(o.responseMask, b * R);
    for (let j = 0; j < P - np; j++) attention[b * T + j] = 0;
    for (let j = P - np; j < P + nr; j++) attention[b * T + j] = 1;
    if (logprobs) {
      const lp = o.responseLogprobs!;
      if (lp.length !== nr) throw new Error(`row ${b}: ${lp.length} log-probs for ${nr} response tokens`);
      logprobs.set(lp, b * R);
    }
    // verl: the score sits on the last response token (index -1, the last slot, when there is none).
    if (scores) scores[b * R + (nr > 0 ? nr - 1 : R - 1)] = o.rewardScore!;
  });
  for (let b = 0; b < B; b++) {
    inputIds.set(prompts.subarray(b * P, (b + 1) * P), b * T);
    inputIds.set(responses.subarray(b * R, (b + 1) * R), b * T + P);
    // position = (number of attended tokens so far) - 1, clipped at 0.
    let seen = 0;
    for (let j = 0; j < T; j++) {
      seen += attention[b * T + j]!;
      positions[b * T + j] = Math.max(seen - 1, 0);
    }
  }
  const out: Record<string, TensorData> = {
    prompts: tensor(prompts, [B, P]),
    responses: tensor(responses, [B, R]),
    response_mask: tensor(responseMask, [B, R]),
    input_ids: tensor(inputIds, [B, T]),
    attention_mask: tensor(attention, [B, T]),
    position_ids: tensor(positions, [B, T]),
  };
  if (logprobs) out.rollout_log_probs = tensor(logprobs, [B, R]);
  const routed = routedExperts(outputs, P, R);
  if (routed) out.routed_experts = routed;
  if (scores) out.rm_scores = tensor(scores, [B, R]);
  return out;
}

/**
 * routed_experts [B, P+R, S, K] when every row has a routing record: each row's tokens from its
 * first prompt column (left padding and the cut-off tail read 0), as verl's agent loop places them.
 */
function routedExperts(outputs: AgentLoopOutput[], P: number, R: number): TensorData | undefined {
  if (outputs.length === 0 || !outputs.every((o) => o.routedExperts)) return undefined;
  const [, S, K] = outputs[0]!.routedExperts!.shape as [number, number, number], SK = S * K, T = P + R;
  const out = new Int32Array(outputs.length * T * SK);
  outputs.forEach((o, b) => {
    const r = o.routedExperts!;
    if (r.shape[1] !== S || r.shape[2] !== K) throw new Error(`row ${b}: routed experts [${r.shape}] do not match row 0's [*, ${S}, ${K}]`);
    const start = P - o.promptIds.length, n = Math.min(r.shape[0]!, o.promptIds.length + o.responseIds.length);
    out.set(r.data.subarray(0, n * SK), (b * T + start) * SK);
  });
  return tensor(out, [outputs.length, T, S, K], "int32");
}

/** Per-row extra fields as non-tensor columns (a row without a key gets null). */
export function extraFieldColumns(outputs: AgentLoopOutput[]): Record<string, unknown[]> {
  const keys = new Set(outputs.flatMap((o) => Object.keys(o.extraFields)));
  const cols: Record<string, unknown[]> = {};
  for (const k of keys) cols[k] = outputs.map((o) => (k in o.extraFields ? o.extraFields[k] : null));
  return cols;
}

function stats(xs: number[]): { min: number; max: number; mean: number } {
  return { min: Math.min(...xs), max: Math.max(...xs), mean: xs.reduce((a, b) => a + b, 0) / xs.length };
}

/** verl's agent_loop/* timing keys, plus the slowest trajectory's lengths. */
export function agentLoopTiming(outputs: AgentLoopOutput[], attention: TensorData, promptLength: number): Record<string, number> {
  if (outputs.length === 0) return {};
  const timing: Record<string, number> = {};
  const gen = outputs.map((o) => o.metrics.generate_sequences);
  const tools = outputs.map((o) => o.metrics.tool_calls);
  const preempt = outputs.map((o) => o.metrics.num_preempted);
  for (const [name, xs] of [["num_preempted", preempt], ["generate_sequences", gen], ["tool_calls", tools]] as const) {
    const s = stats(xs);
    timing[`agent_loop/${name}/min`] = s.min;
    timing[`agent_loop/${name}/max`] = s.max;
    timing[`agent_loop/${name}/mean`] = s.mean;
  }
  let slowest = 0;
  for (let i = 1; i < outputs.length; i++) if (gen[i]! + tools[i]! > gen[slowest]! + tools[slowest]!) slowest = i;
  const T = attention.shape[1]!;
  let p = 0, r = 0;
  for (let j = 0; j < T; j++) {
    const v = attention.data[slowest * T + j]!;
    if (j < promptLength) p += v;
    else r += v;
  }
  timing["agent_loop/slowest/generate_sequences"] = gen[slowest]!;
  timing["agent_loop/slowest/tool_calls"] = tools[slowest]!;
  timing["agent_loop/slowest/prompt_length"] = p;
  timing["agent_loop/slowest/response_length"] = r;
  timing["agent_loop/slowest/num_preempted"] = preempt[slowest]!;
  return timing;
}

/** Counters that are not timings (summed over the batch; tool calls also per row). */
export function agentLoopCounters(outputs: AgentLoopOutput[]): Record<string, number> {
  const sum = (f: (o: AgentLoopOutput) => number) => outputs.reduce((a, o) => a + f(o), 0);
  const n = Math.max(outputs.length, 1);
  return {
    "agent_loop/num_tool_calls": sum((o) => o.metrics.num_tool_calls),
    "agent_loop/num_tool_calls/per_sample": sum((o) => o.metrics.num_tool_calls) / n,
    "agent_loop/tool_call_errors": sum((o) => o.metrics.tool_call_errors),
    "agent_loop/tool_parse_errors": sum((o) => o.metrics.tool_parse_errors),
  };
}
