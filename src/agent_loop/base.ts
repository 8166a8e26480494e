// The agent-loop contract: one loop object per dataset row, `run` drives the
// conversation through the rollout server and returns token ids with a mask
// saying which ones the model wrote.
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import { chatTemplateIds, rowMessages } from "./chat.js";
import type { AgentLoopResources } from "./resources.js";
import type { AsyncRolloutServer, GenerationParams } from "./server.js";
import type { AgentLoopSettings } from "./settings.js";
import type { AgentLoopOutput, AgentLoopRow } from "./types.js";

export interface AgentLoopContext {
  /** The whole trainer config (plain nested object). */
  config: Record<string, unknown>;
  settings: AgentLoopSettings;
  server: AsyncRolloutServer;
  tokenizer: Tokenizer;
  resources: AgentLoopResources;
  /** Extra keys of this loop's entry in rollout.agent.agent_loop_config_path. */
  kwargs: Record<string, unknown>;
}

export abstract class AgentLoopBase {
  protected readonly config: Record<string, unknown>;
  protected readonly settings: AgentLoopSettings;
  protected readonly server: AsyncRolloutServer;
  protected readonly tokenizer: Tokenizer;
  protected readonly resources: AgentLoopResources;
  protected readonly kwargs: Record<string, unknown>;

  constructor(ctx: AgentLoopContext) {
    this.config = ctx.config;
    this.settings = ctx.settings;
    this.server = ctx.server;
    this.tokenizer = ctx.tokenizer;
    this.resources = ctx.resources;
    this.kwargs = ctx.kwargs;
  }

  abstract run(params: GenerationParams, row: AgentLoopRow): Promise<AgentLoopOutput>;

  /** Template messages (with data.apply_chat_template_kwargs) into ids, generation prompt added. */
  protected applyChatTemplate(messages: ChatMessage[], opts: { tools?: unknown[]; removeSystemPrompt?: boolean } = {}): number[] {
    return chatTemplateIds(this.tokenizer, messages, { ...opts, kwargs: this.settings.applyChatTemplateKwargs });
  }

  /** The row's raw_prompt (falling back to its `prompt` column) as messages. */
  protected rowMessages(row: AgentLoopRow): ChatMessage[] {
    const raw = row.fields.raw_prompt ?? row.fields.prompt;
    if (raw === undefined) throw new Error(`row ${row.index}: no raw_prompt (set data.return_raw_chat=True) and no prompt column`);
    return rowMessages(raw, row.index);
  }

  /** Throws when the templated prompt cannot fit rollout.prompt_length. */
  protected checkPromptLength(promptIds: number[], row: AgentLoopRow): void {
    if (promptIds.length > this.settings.promptLength) {
      throw new Error(
        `row ${row.index}: the templated prompt has ${promptIds.length} tokens, more than rollout.prompt_length=${this.settings.promptLength} ` +
          "(tool schemas count too); raise data.max_prompt_length or filter long prompts",
      );
    }
  }
}

export type AgentLoopClass = new (ctx: AgentLoopContext) => AgentLoopBase;
