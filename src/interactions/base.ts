// A simulated user (verl's BaseInteraction): after each assistant turn the
// tool agent loop asks it for the next user message, a turn score, and
// whether the conversation is over. State per conversation lives under the
// instance id (the loop's request id); `finalizeInteraction` drops it.
import { randomUUID } from "node:crypto";
import type { ChatMessage } from "../models/tokenizer.js";

export interface InteractionTurn {
  shouldTerminate: boolean;
  /** The next user message. */
  response: string;
  /** This turn's score (collected into `turn_scores`); null for none. */
  reward: number | null;
  metrics: Record<string, unknown>;
}

export class BaseInteraction {
  readonly config: Record<string, unknown>;
  readonly name: string;

  constructor(config: Record<string, unknown>) {
    this.config = config;
    this.name = typeof config.name === "string" ? config.name : "interaction_agent";
  }

  async startInteraction(instanceId?: string, _kwargs: Record<string, unknown> = {}): Promise<string> {
    return instanceId ?? randomUUID();
  }

  async generateResponse(_instanceId: string, _messages: ChatMessage[], _kwargs: Record<string, unknown> = {}): Promise<InteractionTurn> {
    return { shouldTerminate: false, response: "Your current result seems acceptable.", reward: 0.8, metrics: {} };
  }

  async calculateScore(_instanceId: string, _kwargs: Record<string, unknown> = {}): Promise<number> {
    return 0;
  }

  async finalizeInteraction(_instanceId: string, _kwargs: Record<string, unknown> = {}): Promise<void> {}
}

export type InteractionClass = new (config: Record<string, unknown>) => BaseInteraction;
