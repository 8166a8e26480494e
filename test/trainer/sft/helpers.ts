// Shared pieces of the SFT tests: a tiny from-scratch config and toy examples.
import { loadConfig, type Config } from "../../../src/config/index.js";
import { ARITHMETIC_ALPHABET, arithmeticAnswer, arithmeticQuestion } from "../../../src/data/preprocess/index.js";
import { CharTokenizer } from "../../../src/models/tokenizers/index.js";
import type { DataProto } from "../../../src/protocol/index.js";
import { buildSftExample, collateSft, type SftExample } from "../../../src/trainer/sft/index.js";

export const CHAR_SPEC = `char:${ARITHMETIC_ALPHABET.replace(/\n/g, "\\n")}`;
export const charTok = new CharTokenizer(ARITHMETIC_ALPHABET);

/** sft_trainer config for a tiny scratch model on the char tokenizer. */
export function tinySftConfig(extra: string[] = []): Config {
  return loadConfig({
    configName: "sft_trainer",
    overrides: [
      "model.partial_pretrain=scratch", `model.tokenizer_path="${CHAR_SPEC}"`,
      "+model.override_config.hidden_size=16", "+model.override_config.num_hidden_layers=1",
      "+model.override_config.num_attention_heads=2", "trainer.seed=3", "trainer.logger=[]",
      "optim.lr=0.01", "optim.lr_warmup_steps_ratio=0", "optim.lr_scheduler=constant", ...extra,
    ],
  });
}

/** Addition examples with prompts and responses of several lengths. */
export function toyExamples(pairs: [number, number][], maxLength = 36): SftExample[] {
  return pairs.map(([a, b], i) => buildSftExample(
    charTok.encode(arithmeticQuestion(a, b), { addSpecialTokens: false }),
    [...charTok.encode(arithmeticAnswer(a, b), { addSpecialTokens: false }), charTok.eosTokenId],
    { maxLength, padTokenId: charTok.padTokenId, truncation: "error", where: `pair ${i}` },
  ));
}

export function toyBatch(pairs: [number, number][], maxLength = 36): DataProto {
  return collateSft(toyExamples(pairs, maxLength), maxLength);
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}
