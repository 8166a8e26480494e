// The state of one trajectory as the tool agent loop moves it through its
// states. Tools receive it (ToolCallContext.agentData) and may keep their own
// session data in `extraFields`.
import type { TensorData } from "../protocol/tensor.js";
import type { ChatMessage } from "../models/tokenizer.js";
import type { BaseInteraction } from "../interactions/base.js";
import type { BaseTool } from "../tools/base_tool.js";
import type { OpenAIFunctionToolSchema } from "../tools/schemas.js";
import type { FunctionCall } from "./tool_parser.js";
import type { AgentLoopMetrics } from "./types.js";

export class AgentData {
  /** Ids of the whole conversation so far: the prompt, then every turn. */
  promptIds: number[] = [];
  /** The last assistant turn's ids. */
  responseIds: number[] = [];
  /** One entry per id after the prompt: 1 = the model wrote it, 0 = a tool or the user did. */
  responseMask: number[] = [];
  responseLogprobs: number[] = [];
  /** The last generation's routing record (prompt + its output), when the server records it. */
  routedExperts: TensorData | null = null;
  turnScores: number[] = [];
  toolRewards: number[] = [];
  userTurns = 0;
  assistantTurns = 0;
  /** Calls parsed from the last assistant turn. */
  toolCalls: FunctionCall[] = [];
  extraFields: Record<string, unknown> = {};

  constructor(
    readonly messages: ChatMessage[],
    readonly requestId: string,
    readonly metrics: AgentLoopMetrics,
    /** tools_kwargs of the row: {toolName: {create_kwargs, execute_kwargs, calc_reward_kwargs, release_kwargs}}. */
    readonly toolsKwargs: Record<string, Record<string, unknown>>,
    /** The tools this row may call (all configured tools unless the row has tool_selection). */
    readonly activeTools: ReadonlyMap<string, BaseTool>,
    readonly activeToolSchemas: OpenAIFunctionToolSchema[],
    readonly interaction: BaseInteraction | null,
    readonly interactionKwargs: Record<string, unknown>,
  ) {}
}
