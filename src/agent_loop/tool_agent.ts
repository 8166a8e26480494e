// tool_agent: a multi-turn conversation as a state machine (verl's ToolAgentLoop).
//   PENDING -> GENERATING -> PROCESSING_TOOLS -> GENERATING ...
//                         -> INTERACTING      -> GENERATING ...
//                         -> TERMINATED
// Model tokens get mask 1; tool and user tokens get mask 0 so the policy
// loss ignores them. Termination (checked after each assistant turn): the
// response budget is used up, max_assistant_turns or max_user_turns reached,
// no tool call and no interaction; a tool turn that would overflow the budget
// ends the trajectory without being appended.
import { randomUUID } from "node:crypto";
import type { ChatMessage } from "../models/tokenizer.js";
import type { BaseInteraction } from "../interactions/base.js";
import type { BaseTool } from "../tools/base_tool.js";
import { checkToolResponse, type OpenAIFunctionToolSchema, type ToolResponse } from "../tools/schemas.js";
import { logger } from "../utils/logger.js";
import { AgentData } from "./agent_data.js";
import { AgentLoopBase } from "./base.js";
import { seededForTurn, type GenerationParams } from "./server.js";
import { getToolParser, type FunctionCall, type ToolParser } from "./tool_parser.js";
import { truncateToolResponse } from "./truncate.js";
import { emptyMetrics, type AgentLoopOutput, type AgentLoopRow } from "./types.js";

export enum AgentState {
  PENDING = "pending",
  GENERATING = "generating",
  PROCESSING_TOOLS = "processing_tools",
  INTERACTING = "interacting",
  TERMINATED = "terminated",
}

interface ToolResult {
  response: ToolResponse;
  reward: number | null;
  failed: boolean;
}

function asRecord(v: unknown): Record<string, unknown> | undefined {
  return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : undefined;
}

export class ToolAgentLoop extends AgentLoopBase {
  private parser: ToolParser | undefined;
  /** The states visited, in order (for tests and traces). */
  readonly trace: AgentState[] = [];

  async run(params: GenerationParams, row: AgentLoopRow): Promise<AgentLoopOutput> {
    const mt = this.settings.multiTurn;
    this.parser = getToolParser(mt.format, this.tokenizer);
    const requestId = randomUUID();
    const tools = await this.resources.tools(mt.toolConfigPath);
    const interaction = await this.pickInteraction(row);
    const { active, schemas } = this.selectTools(tools, row);
    const data = new AgentData(
      this.rowMessages(row),
      requestId,
      emptyMetrics(),
      this.toolsKwargs(row),
      active,
      schemas,
      interaction?.interaction ?? null,
      interaction?.kwargs ?? {},
    );
    if (interaction) await interaction.interaction.startInteraction(requestId, interaction.kwargs);
    try {
      let state = AgentState.PENDING;
      while (state !== AgentState.TERMINATED) {
        this.trace.push(state);
        state = await this.step(state, data, params, row);
      }
      this.trace.push(state);
    } finally {
      // verl never finalizes; we do, so interaction state does not pile up across steps.
      if (interaction) await interaction.interaction.finalizeInteraction(requestId, interaction.kwargs);
    }
    return this.output(data, params);
  }

  private async step(state: AgentState, data: AgentData, params: GenerationParams, row: AgentLoopRow): Promise<AgentState> {
    switch (state) {
      case AgentState.PENDING:
        return this.handlePending(data, row);
      case AgentState.GENERATING:
        return this.handleGenerating(data, seededForTurn(params, row.fields.rollout_seed, data.assistantTurns));
      case AgentState.PROCESSING_TOOLS:
        return this.handleProcessingTools(data, params);
      case AgentState.INTERACTING:
        return this.handleInteracting(data, params);
      default:
        throw new Error(`tool agent: unexpected state ${state}`);
    }
  }

  private handlePending(data: AgentData, row: AgentLoopRow): AgentState {
    data.promptIds = this.applyChatTemplate(data.messages, { tools: data.activeToolSchemas });
    this.checkPromptLength(data.promptIds, row);
    return AgentState.GENERATING;
  }

  private async handleGenerating(data: AgentData, params: GenerationParams): Promise<AgentState> {
    const mt = this.settings.multiTurn;
    const budget = this.settings.responseLength - data.responseMask.length;
    // A user turn can fill the budget; generating then would only be cut off.
    if (budget <= 0) return AgentState.TERMINATED;
    const start = performance.now();
    const out = await this.server.generate(data.requestId, data.promptIds, { ...params, maxTokens: budget });
    data.metrics.generate_sequences += (performance.now() - start) / 1000;
    // verl: the first turn sets it (-1 = unknown), later turns add.
    if (data.assistantTurns === 0) data.metrics.num_preempted = out.numPreempted ?? -1;
    else data.metrics.num_preempted += out.numPreempted ?? 0;
    data.assistantTurns += 1;
    data.responseIds = out.tokenIds;
    // the last generation's record covers the whole conversation so far (its prompt holds every earlier turn)
    if (out.routedExperts) data.routedExperts = out.routedExperts;
    data.promptIds.push(...out.tokenIds);
    for (let i = 0; i < out.tokenIds.length; i++) data.responseMask.push(1);
    if (params.logprobs) {
      if (!out.logProbs || out.logProbs.length !== out.tokenIds.length) {
        throw new Error(`rollout server returned ${out.logProbs?.length ?? 0} log-probs for ${out.tokenIds.length} tokens`);
      }
      data.responseLogprobs.push(...out.logProbs);
    }

    if (data.responseMask.length >= this.settings.responseLength) return AgentState.TERMINATED;
    if (mt.maxAssistantTurns && data.assistantTurns >= mt.maxAssistantTurns) return AgentState.TERMINATED;
    if (mt.maxUserTurns && data.userTurns >= mt.maxUserTurns) return AgentState.TERMINATED;

    const parsed = await this.parser!.extractToolCalls(data.responseIds);
    data.toolCalls = parsed.toolCalls;
    data.metrics.tool_parse_errors += parsed.errors;
    if (data.interaction) {
      data.messages.push({ role: "assistant", content: this.tokenizer.decode(data.responseIds, { skipSpecialTokens: true }) });
    }
    if (data.toolCalls.length > 0) return AgentState.PROCESSING_TOOLS;
    if (data.interaction) return AgentState.INTERACTING;
    return AgentState.TERMINATED;
  }

  private async handleProcessingTools(data: AgentData, params: GenerationParams): Promise<AgentState> {
    const calls = data.toolCalls.slice(0, this.settings.multiTurn.maxParallelCalls);
    const start = performance.now();
    const results = await Promise.all(calls.map((c) => this.callTool(c, data)));
    data.metrics.tool_calls += (performance.now() - start) / 1000;
    data.metrics.num_tool_calls += calls.length;
    const added: ChatMessage[] = [];
    for (const r of results) {
      if ((r.response.image && r.response.image.length > 0) || (r.response.video && r.response.video.length > 0)) {
        throw new Error("a tool returned images or video; verl-ts agent loops handle text-only tool responses");
      }
      added.push({ role: "tool", content: r.response.text ?? "" });
      if (r.failed) data.metrics.tool_call_errors += 1;
      if (r.reward !== null) data.toolRewards.push(r.reward);
    }
    data.messages.push(...added);
    const ids = this.applyChatTemplate(added, { removeSystemPrompt: true });
    if (data.responseMask.length + ids.length >= this.settings.responseLength) return AgentState.TERMINATED;
    this.appendObservation(data, ids, params);
    data.userTurns += 1;
    return AgentState.GENERATING;
  }

  private async handleInteracting(data: AgentData, params: GenerationParams): Promise<AgentState> {
    const turn = await data.interaction!.generateResponse(data.requestId, data.messages, data.interactionKwargs);
    data.userTurns += 1;
    const message: ChatMessage = { role: "user", content: turn.response };
    data.messages.push(message);
    if (turn.reward !== null && turn.reward !== undefined) data.turnScores.push(turn.reward);
    this.appendObservation(data, this.applyChatTemplate([message], { removeSystemPrompt: true }), params);
    return turn.shouldTerminate ? AgentState.TERMINATED : AgentState.GENERATING;
  }

  /** Tool or user ids join the conversation with mask 0 (and log-prob 0). */
  private appendObservation(data: AgentData, ids: number[], params: GenerationParams): void {
    data.promptIds.push(...ids);
    for (let i = 0; i < ids.length; i++) data.responseMask.push(0);
    if (params.logprobs) for (let i = 0; i < ids.length; i++) data.responseLogprobs.push(0);
  }

  /** create -> execute -> release (release always, once created); any failure becomes text for the model. */
  private async callTool(call: FunctionCall, data: AgentData): Promise<ToolResult> {
    let tool: BaseTool | undefined;
    let instanceId: string | undefined;
    const kwargs = asRecord(data.toolsKwargs[call.name]) ?? {};
    let text: string | undefined;
    let response: ToolResponse;
    let reward: number;
    try {
      const args: unknown = JSON.parse(call.arguments);
      if (asRecord(args) === undefined) throw new Error(`arguments of '${call.name}' must be a JSON object, got ${call.arguments}`);
      tool = data.activeTools.get(call.name);
      if (!tool) throw new Error(`unknown tool '${call.name}' (available: ${[...data.activeTools.keys()].join(", ") || "none"})`);
      ({ instanceId } = await tool.create({ createKwargs: asRecord(kwargs.create_kwargs) ?? {} }));
      const res = await tool.execute(instanceId, args as Record<string, unknown>, { agentData: data, kwargs: asRecord(kwargs.execute_kwargs) ?? {} });
      response = checkToolResponse(res.response, call.name);
      reward = res.reward;
      text = response.text;
    } catch (e) {
      logger().warn({ tool: call.name, err: e instanceof Error ? e.message : String(e) }, "tool call failed");
      return { response: { text: `Error when executing tool: ${e instanceof Error ? e.message : String(e)}` }, reward: 0, failed: true };
    } finally {
      if (tool && instanceId !== undefined) {
        try {
          await tool.release(instanceId, asRecord(kwargs.release_kwargs) ?? {});
        } catch (e) {
          logger().warn({ tool: call.name, err: (e as Error).message }, "tool release failed");
        }
      }
    }
    const mt = this.settings.multiTurn;
    if (text) text = truncateToolResponse(text, mt.maxToolResponseLength, mt.toolResponseTruncateSide);
    return { response: { ...response, text }, reward: typeof reward === "number" ? reward : null, failed: false };
  }

  /** tools_kwargs of the row (top level, else extra_info.tools_kwargs). */
  private toolsKwargs(row: AgentLoopRow): Record<string, Record<string, unknown>> {
    const extra = asRecord(row.fields.extra_info);
    const raw = row.fields.tools_kwargs ?? extra?.tools_kwargs ?? {};
    const rec = asRecord(raw);
    if (!rec) throw new Error(`row ${row.index}: tools_kwargs must be a mapping {tool_name: {create_kwargs, ...}}`);
    return rec as Record<string, Record<string, unknown>>;
  }

  /** All configured tools, or those the row names in tool_selection (top level or extra_info). */
  private selectTools(tools: BaseTool[], row: AgentLoopRow): { active: Map<string, BaseTool>; schemas: OpenAIFunctionToolSchema[] } {
    const all = new Map(tools.map((t) => [t.name, t]));
    const selection = row.fields.tool_selection ?? asRecord(row.fields.extra_info)?.tool_selection;
    if (selection === undefined || selection === null) return { active: all, schemas: tools.map((t) => t.toolSchema) };
    if (!Array.isArray(selection) || selection.some((s) => typeof s !== "string")) {
      throw new Error(`row ${row.index}: tool_selection must be a list of tool names`);
    }
    const active = new Map<string, BaseTool>();
    for (const name of selection as string[]) {
      const tool = all.get(name);
      if (!tool) throw new Error(`row ${row.index}: tool_selection names '${name}', which the tool config does not define (defined: ${[...all.keys()].join(", ") || "none"})`);
      active.set(name, tool);
    }
    return { active, schemas: [...active.values()].map((t) => t.toolSchema) };
  }

  /** The row's interaction (by interaction_kwargs.name; the only one configured when unnamed). */
  private async pickInteraction(row: AgentLoopRow): Promise<{ interaction: BaseInteraction; kwargs: Record<string, unknown> } | null> {
    const path = this.settings.multiTurn.interactionConfigPath;
    if (path === null) return null;
    const map = await this.resources.interactions(path);
    const kwargs = asRecord(row.fields.interaction_kwargs ?? asRecord(row.fields.extra_info)?.interaction_kwargs);
    if (!kwargs) throw new Error(`row ${row.index}: an interaction config is set but the row has no extra_info.interaction_kwargs`);
    let name = kwargs.name;
    if (name === undefined && map.size === 1) name = [...map.keys()][0];
    if (typeof name !== "string") throw new Error(`row ${row.index}: interaction_kwargs needs a 'name' (configured: ${[...map.keys()].join(", ")})`);
    const interaction = map.get(name);
    if (!interaction) throw new Error(`row ${row.index}: interaction '${name}' is not configured (configured: ${[...map.keys()].join(", ") || "none"})`);
    return { interaction, kwargs: { ...kwargs, name } };
  }

  private output(data: AgentData, params: GenerationParams): AgentLoopOutput {
    const R = this.settings.responseLength;
    const split = data.promptIds.length - data.responseMask.length;
    return {
      promptIds: data.promptIds.slice(0, split),
      responseIds: data.promptIds.slice(split).slice(0, R),
      responseMask: data.responseMask.slice(0, R),
      responseLogprobs: params.logprobs ? data.responseLogprobs.slice(0, R) : null,
      routedExperts: data.routedExperts,
      numTurns: data.userTurns + data.assistantTurns + 1,
      metrics: data.metrics,
      extraFields: { turn_scores: data.turnScores, tool_rewards: data.toolRewards },
    };
  }
}
