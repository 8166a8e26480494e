// calc_gsm8k_reward (verl's Gsm8kTool): the model submits an answer, the tool
// scores it against the row's ground truth (flexible matching) and tells the
// model what it parsed. Step reward: 0 when the score improved on the last
// submission, -0.05 otherwise (discourages resubmitting the same answer).
import { randomUUID } from "node:crypto";
import { gsm8kComputeScore } from "../reward/scorers/gsm8k.js";
import { BaseTool, type ToolCreateOptions, type ToolExecution } from "./base_tool.js";
import { pyFloatRepr, pyStrRepr } from "./py_repr.js";
import type { OpenAIFunctionToolSchema, ToolResponse } from "./schemas.js";

interface Gsm8kInstance {
  response: string;
  groundTruth: unknown;
  reward: number;
}

/** The schema verl's example config gives the tool (used when the YAML has no tool_schema). */
export const GSM8K_TOOL_SCHEMA: OpenAIFunctionToolSchema = {
  type: "function",
  function: {
    name: "calc_gsm8k_reward",
    description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)",
    parameters: {
      type: "object",
      properties: { answer: { type: "string", description: "The model's answer to the GSM8K math problem, must be a digits" } },
      required: ["answer"],
    },
  },
};

export class Gsm8kTool extends BaseTool {
  private readonly instances = new Map<string, Gsm8kInstance>();

  override getOpenaiToolSchema(): OpenAIFunctionToolSchema {
    return this.toolSchema ?? GSM8K_TOOL_SCHEMA;
  }

  /** Ground truth comes from tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth. */
  override async create(opts: ToolCreateOptions = {}): Promise<{ instanceId: string; response: ToolResponse }> {
    const instanceId = opts.instanceId ?? randomUUID();
    this.instances.set(instanceId, { response: "", groundTruth: opts.createKwargs?.ground_truth ?? null, reward: 0 });
    return { instanceId, response: {} };
  }

  override async execute(instanceId: string, parameters: Record<string, unknown>): Promise<ToolExecution> {
    const inst = this.instance(instanceId);
    const raw = parameters.answer ?? "";
    const answer = typeof raw === "string" ? raw : typeof raw === "object" ? JSON.stringify(raw) : String(raw);
    inst.response = answer.startsWith("#### ") ? answer : `#### ${answer}`;
    const reward = await this.calcReward(instanceId);
    const stepReward = reward > inst.reward ? 0.0 : -0.05;
    inst.reward = reward;
    return { response: { text: `Current parsed answer=${pyStrRepr(answer)} reward=${pyFloatRepr(reward)}` }, reward: stepReward, metrics: {} };
  }

  override async calcReward(instanceId: string): Promise<number> {
    const inst = this.instance(instanceId);
    if (inst.groundTruth === null) return 0;
    return gsm8kComputeScore(inst.response, inst.groundTruth, { method: "flexible", formatScore: 0.0, score: 1.0 });
  }

  override async release(instanceId: string): Promise<void> {
    this.instances.delete(instanceId);
  }

  /** Live instances (for tests: release must leave none behind). */
  get liveInstances(): number {
    return this.instances.size;
  }

  private instance(id: string): Gsm8kInstance {
    const inst = this.instances.get(id);
    if (!inst) throw new Error(`calc_gsm8k_reward: no instance '${id}' (create was not called or it was released)`);
    return inst;
  }
}
