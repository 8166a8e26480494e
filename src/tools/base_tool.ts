// The tool contract (verl's BaseTool): one tool object serves every
// trajectory; per-trajectory state lives under an instance id made by
// `create` and dropped by `release`, which the agent loop always calls.
import { randomUUID } from "node:crypto";
import type { AgentData } from "../agent_loop/agent_data.js";
import type { OpenAIFunctionToolSchema, ToolResponse } from "./schemas.js";

export interface ToolCreateOptions {
  instanceId?: string;
  /** tools_kwargs[name].create_kwargs from the dataset row (e.g. {ground_truth}). */
  createKwargs?: Record<string, unknown>;
}

export interface ToolCallContext {
  /** The calling trajectory's state (messages, ids so far, extra fields). */
  agentData?: AgentData;
  /** tools_kwargs[name].execute_kwargs / calc_reward_kwargs / release_kwargs from the row. */
  kwargs?: Record<string, unknown>;
}

export interface ToolExecution {
  response: ToolResponse;
  /** The step reward of this call (collected into `tool_rewards`). */
  reward: number;
  metrics: Record<string, unknown>;
}

export class BaseTool {
  readonly config: Record<string, unknown>;
  readonly toolSchema: OpenAIFunctionToolSchema;
  readonly name: string;

  constructor(config: Record<string, unknown>, toolSchema: OpenAIFunctionToolSchema | null) {
    this.config = config;
    const schema = toolSchema ?? this.getOpenaiToolSchema();
    if (!schema) throw new Error(`${new.target.name}: no tool_schema given and getOpenaiToolSchema() returned none`);
    this.toolSchema = schema;
    this.name = schema.function.name;
  }

  /** The schema rendered into the prompt. Override to build it in code instead of YAML. */
  getOpenaiToolSchema(): OpenAIFunctionToolSchema {
    return this.toolSchema;
  }

  async create(opts: ToolCreateOptions = {}): Promise<{ instanceId: string; response: ToolResponse }> {
    return { instanceId: opts.instanceId ?? randomUUID(), response: {} };
  }

  async execute(_instanceId: string, _parameters: Record<string, unknown>, _ctx: ToolCallContext = {}): Promise<ToolExecution> {
    return { response: { text: "Updated the tool state." }, reward: 0, metrics: {} };
  }

  async calcReward(_instanceId: string, _kwargs: Record<string, unknown> = {}): Promise<number> {
    return 0;
  }

  async release(_instanceId: string, _kwargs: Record<string, unknown> = {}): Promise<void> {}
}

export type ToolClass = new (config: Record<string, unknown>, toolSchema: OpenAIFunctionToolSchema | null) => BaseTool;
