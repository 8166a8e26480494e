// Shared by the LoRA and DoRA tests: greedy decodes of one model by the KV-cache engine (merged
// weights) and by the no-cache engine (the training forward), which must agree.
import type { LlamaModel } from "../../src/models/llama.js";
import type { DataProto } from "../../src/protocol/index.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { Rng } from "../../src/utils/rng.js";

export const DECODE_PROMPTS = leftPadPrompts([[1, 5, 9], [3, 8]], 0);
export const GREEDY = defaultSamplingParams({ temperature: 0, responseLength: 8, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true });

export function decodeBothWays(m: LlamaModel): { fast: DataProto; slow: DataProto } {
  return {
    fast: generate(m, DECODE_PROMPTS, GREEDY, new Rng(0)),
    slow: generate(m, DECODE_PROMPTS, GREEDY, new Rng(0), { engine: "no-cache" }),
  };
}
