// single_turn_agent: template the prompt, generate once, done (num_turns 2).
import { randomUUID } from "node:crypto";
import { AgentLoopBase } from "./base.js";
import { seededForTurn, type GenerationParams } from "./server.js";
import { emptyMetrics, type AgentLoopOutput, type AgentLoopRow } from "./types.js";

export class SingleTurnAgentLoop extends AgentLoopBase {
  async run(params: GenerationParams, row: AgentLoopRow): Promise<AgentLoopOutput> {
    const promptIds = await this.promptIds(row);
    this.checkPromptLength(promptIds, row);
    const metrics = emptyMetrics();
    const responseLength = this.settings.responseLength;
    const start = performance.now();
    const out = await this.server.generate(randomUUID(), promptIds, { ...seededForTurn(params, row.fields.rollout_seed, 0), maxTokens: responseLength });
    metrics.generate_sequences = (performance.now() - start) / 1000;
    metrics.num_preempted = out.numPreempted ?? -1;
    const responseIds = out.tokenIds.slice(0, responseLength);
    return {
      promptIds,
      responseIds,
      responseMask: responseIds.map(() => 1),
      responseLogprobs: out.logProbs ? out.logProbs.slice(0, responseLength) : null,
      routedExperts: out.routedExperts ?? null,
      numTurns: 2,
      metrics,
      extraFields: { turn_scores: [], tool_rewards: [] },
    };
  }

  /** The chat-templated raw prompt (with data.tool_config_path schemas), else the batch's own prompt ids. */
  private async promptIds(row: AgentLoopRow): Promise<number[]> {
    const hasRaw = row.fields.raw_prompt !== undefined || row.fields.prompt !== undefined;
    if (hasRaw && this.tokenizer.hasChatTemplate) {
      const tools = await this.resources.tools(this.settings.dataToolConfigPath);
      return this.applyChatTemplate(this.rowMessages(row), { tools: tools.map((t) => t.toolSchema) });
    }
    if (row.promptIds) return row.promptIds;
    throw new Error(`row ${row.index}: no prompt ids in the batch and no raw_prompt the tokenizer can template`);
  }
}
