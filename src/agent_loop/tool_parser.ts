// Tool-call parsers turn a model's response tokens into function calls.
// Registered by name; `rollout.multi_turn.format` picks one. A malformed call
// is skipped and counted (reported as agent_loop/tool_parse_errors), never fatal.
import type { Tokenizer } from "../models/tokenizer.js";
import { logger } from "../utils/logger.js";
import { NamedRegistry } from "./named_registry.js";

export interface FunctionCall {
  name: string;
  /** The arguments as a JSON string, as the model wrote them (re-serialised). */
  arguments: string;
}

export interface ToolParseResult {
  /** The response text with the calls removed. */
  content: string;
  toolCalls: FunctionCall[];
  /** Calls that were found but could not be parsed. */
  errors: number;
}

export abstract class ToolParser {
  constructor(protected readonly tokenizer: Tokenizer) {}
  abstract extractToolCalls(responseIds: readonly number[]): Promise<ToolParseResult>;
}

export type ToolParserClass = new (tokenizer: Tokenizer) => ToolParser;

const parsers = new NamedRegistry<ToolParserClass>("tool parser");

export function registerToolParser(name: string, cls: ToolParserClass): void {
  parsers.register(name, cls);
}

export function getToolParser(name: string, tokenizer: Tokenizer): ToolParser {
  return new (parsers.get(name))(tokenizer);
}

export function toolParserNames(): string[] {
  return parsers.names();
}

/** Parse one `{"name": ..., "arguments": {...}}` object; throws with the reason. */
export function parseCallJson(body: string): FunctionCall {
  const obj: unknown = JSON.parse(body);
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) throw new Error("tool call is not a JSON object");
  const { name, arguments: args } = obj as Record<string, unknown>;
  if (typeof name !== "string") throw new Error("tool call has no string 'name'");
  if (args === undefined) throw new Error(`tool call '${name}' has no 'arguments'`);
  return { name, arguments: JSON.stringify(args) };
}

/** Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, spanning lines. */
export class HermesToolParser extends ToolParser {
  static readonly startTag = "<tool_call>";
  static readonly endTag = "</tool_call>";

  async extractToolCalls(responseIds: readonly number[]): Promise<ToolParseResult> {
    const text = this.tokenizer.decode(responseIds);
    if (!text.includes(HermesToolParser.startTag) || !text.includes(HermesToolParser.endTag)) {
      return { content: text, toolCalls: [], errors: 0 };
    }
    const pattern = /<tool_call>([\s\S]*?)<\/tool_call>/g;
    const toolCalls: FunctionCall[] = [];
    let errors = 0;
    for (const match of text.matchAll(pattern)) {
      try {
        toolCalls.push(parseCallJson(match[1]!));
      } catch (e) {
        errors++;
        logger().debug({ err: (e as Error).message }, "skipping a malformed tool call");
      }
    }
    return { content: text.replace(pattern, ""), toolCalls, errors };
  }
}

registerToolParser("hermes", HermesToolParser);
