// Test doubles and builders for the agent-loop tests: a char-level tokenizer
// with a Qwen-like chat template (one token per character, so token counts
// are text lengths) and a scripted rollout server that answers each request
// from a script and records what it was asked.
import { CharTokenizer } from "../../src/models/tokenizers/index.js";
import type { AsyncRolloutServer, GenerationParams, TokenOutput } from "../../src/agent_loop/server.js";

const PRINTABLE = Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)).join("") + "\n";

/** Qwen-style: a default system prompt when none is given, tools listed in it, tool results inside a user turn. */
export const TEST_CHAT_TEMPLATE =
  "{%- if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% else %}{% set sys = 'You are helpful.' %}{% endif %}" +
  "<|im_start|>system\n{{ sys }}" +
  "{%- if tools %}\n# Tools\n{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}\n{% endfor %}{% endif %}<|im_end|>\n" +
  "{%- for m in messages %}{% if m.role == 'system' and loop.first %}{% elif m.role == 'tool' %}" +
  "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n" +
  "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}" +
  "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

export function testTokenizer(): CharTokenizer {
  return new CharTokenizer(PRINTABLE, TEST_CHAT_TEMPLATE);
}

export const EOS = 2;

export interface RecordedCall {
  requestId: string;
  promptIds: number[];
  params: GenerationParams;
}

type Script = (call: RecordedCall, turn: number) => string | number[];

/** Answers request k of a conversation with script(call, k) (+ EOS for strings), cut to maxTokens. */
export class ScriptedServer implements AsyncRolloutServer {
  readonly calls: RecordedCall[] = [];
  private readonly turns = new Map<string, number>();
  inFlight = 0;
  maxInFlight = 0;

  constructor(private readonly tokenizer: CharTokenizer, private readonly script: Script, private readonly delayMs = 0) {}

  async generate(requestId: string, promptIds: readonly number[], params: GenerationParams): Promise<TokenOutput> {
    const call = { requestId, promptIds: [...promptIds], params: { ...params } };
    this.calls.push(call);
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    try {
      if (this.delayMs) await new Promise((r) => setTimeout(r, this.delayMs));
      const turn = this.turns.get(requestId) ?? 0;
      this.turns.set(requestId, turn + 1);
      const answer = this.script(call, turn);
      let ids = typeof answer === "string" ? [...this.tokenizer.encode(answer, { addSpecialTokens: false }), EOS] : answer;
      if (params.maxTokens !== undefined) ids = ids.slice(0, params.maxTokens);
      return {
        tokenIds: ids,
        logProbs: params.logprobs ? ids.map((_, i) => -0.5 - i / 100) : undefined,
        numPreempted: 0,
        finishReason: ids[ids.length - 1] === EOS ? "stop" : "length",
      };
    } finally {
      this.inFlight--;
    }
  }
}

/** A trainer config with only the keys the agent loops read. */
export function testConfig(over: {
  promptLength?: number;
  responseLength?: number;
  multiTurn?: Record<string, unknown>;
  agent?: Record<string, unknown>;
  rollout?: Record<string, unknown>;
  data?: Record<string, unknown>;
} = {}): Record<string, unknown> {
  return {
    data: { max_prompt_length: over.promptLength ?? 256, max_response_length: over.responseLength ?? 256, ...over.data },
    actor_rollout_ref: {
      rollout: {
        prompt_length: over.promptLength ?? 256,
        response_length: over.responseLength ?? 256,
        temperature: 1.0,
        top_p: 1.0,
        top_k: -1,
        calculate_log_probs: false,
        val_kwargs: { temperature: 0, top_p: 1.0, top_k: -1, do_sample: false },
        multi_turn: { enable: true, max_parallel_calls: 1, max_tool_response_length: 256, tool_response_truncate_side: "middle", format: "hermes", ...over.multiTurn },
        agent: { default_agent_loop: "single_turn_agent", max_concurrent_loops: 64, ...over.agent },
        ...over.rollout,
      },
    },
  };
}

/** Text of the ids (special tokens spelled out). */
export function text(tok: CharTokenizer, ids: ArrayLike<number>): string {
  return tok.decode(Array.from(ids));
}
