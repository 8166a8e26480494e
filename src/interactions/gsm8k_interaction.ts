// A simulated user for GSM8K (verl's Gsm8kInteraction): it reads the last
// assistant message, scores it strictly ("#### <answer>"), and either accepts
// it (ending the conversation) or asks the model to reflect and try again.
import type { ChatMessage } from "../models/tokenizer.js";
import { gsm8kComputeScore } from "../reward/scorers/gsm8k.js";
import { BaseInteraction, type InteractionTurn } from "./base.js";

interface Gsm8kConversation {
  response: string;
  groundTruth: unknown;
  reward: number;
}

export const GSM8K_CORRECT = "Your response is correct!";
export const GSM8K_INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again.";

export class Gsm8kInteraction extends BaseInteraction {
  private readonly conversations = new Map<string, Gsm8kConversation>();

  override async startInteraction(instanceId?: string, kwargs: Record<string, unknown> = {}): Promise<string> {
    const id = await super.startInteraction(instanceId);
    this.conversations.set(id, { response: "", groundTruth: kwargs.ground_truth ?? null, reward: 0 });
    return id;
  }

  override async generateResponse(instanceId: string, messages: ChatMessage[]): Promise<InteractionTurn> {
    const conv = this.conversation(instanceId);
    const last = [...messages].reverse().find((m) => m.role === "assistant");
    conv.response = typeof last?.content === "string" ? last.content : "";
    const reward = await this.calculateScore(instanceId);
    const correct = reward === 1.0;
    return { shouldTerminate: correct, response: correct ? GSM8K_CORRECT : GSM8K_INCORRECT, reward, metrics: {} };
  }

  override async calculateScore(instanceId: string): Promise<number> {
    const conv = this.conversation(instanceId);
    if (conv.groundTruth === null) return 0;
    return gsm8kComputeScore(conv.response, conv.groundTruth, { method: "strict", formatScore: 0.0, score: 1.0 });
  }

  override async finalizeInteraction(instanceId: string): Promise<void> {
    this.conversations.delete(instanceId);
  }

  /** Open conversations (for tests: finalize must leave none behind). */
  get openConversations(): number {
    return this.conversations.size;
  }

  private conversation(id: string): Gsm8kConversation {
    const conv = this.conversations.get(id);
    if (!conv) throw new Error(`gsm8k interaction: no conversation '${id}' (start_interaction was not called or it was finalized)`);
    return conv;
  }
}
