// What an agent loop receives and returns (verl's AgentLoopOutput).
import type { TensorData } from "../protocol/tensor.js";

export interface AgentLoopMetrics {
  /** Seconds spent awaiting the rollout server (all turns). */
  generate_sequences: number;
  /** Seconds spent in tool calls. */
  tool_calls: number;
  /** Times a request was preempted by the server; -1 when unknown. */
  num_preempted: number;
  /** Tool calls executed. */
  num_tool_calls: number;
  /** Tool calls that ended in "Error when executing tool: ...". */
  tool_call_errors: number;
  /** Tool calls the parser found but could not read. */
  tool_parse_errors: number;
}

export function emptyMetrics(): AgentLoopMetrics {
  return { generate_sequences: 0, tool_calls: 0, num_preempted: 0, num_tool_calls: 0, tool_call_errors: 0, tool_parse_errors: 0 };
}

export interface AgentLoopOutput {
  /** The prompt as the loop templated it (not padded). */
  promptIds: number[];
  /** Everything after the prompt: model turns and tool/user turns, at most rollout.response_length ids. */
  responseIds: number[];
  /** Same length as responseIds: 1 = model token, 0 = tool or user token. */
  responseMask: number[];
  /** Log-probs aligned with responseIds (0 for tool/user tokens), when asked for. */
  responseLogprobs?: number[] | null;
  /**
   * MoE (rollout.enable_rollout_routing_replay): the experts of prompt + response tokens,
   * [tokens, sparseLayers, topK] (the last generation's record); becomes routed_experts.
   */
  routedExperts?: TensorData | null;
  /** A trajectory reward the loop computed itself; becomes rm_scores when every row has one. */
  rewardScore?: number | null;
  /** user turns + assistant turns + 1 (the prompt). */
  numTurns: number;
  metrics: AgentLoopMetrics;
  /** Per-row extras, output as non-tensor columns (turn_scores, tool_rewards, ...). */
  extraFields: Record<string, unknown>;
}

/** One dataset row as the loop sees it. */
export interface AgentLoopRow {
  /** Position of the row in the batch. */
  index: number;
  /** The row's non-tensor fields (raw_prompt, extra_info, tools_kwargs, agent_name, ...). */
  fields: Record<string, unknown>;
  /** The row's prompt ids from the batch (input_ids without padding), when the batch has them. */
  promptIds?: number[];
}
