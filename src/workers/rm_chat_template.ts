// reward_model.model.input_tokenizer: a reward model whose tokenizer or chat template differs from the
// policy's cannot read the policy's token ids. As verl's RewardModelWorker does (_switch_chat_template),
// each row's response is decoded with the policy's tokenizer, its eos text removed, appended to the
// row's raw_prompt as the assistant turn, rendered with the reward model's chat template (no
// generation prompt) and tokenized for the reward model: right-padded to reward_model.max_length
// (else the batch's sequence width), truncated from the right, positions counted over the mask.
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import { DataProto } from "../protocol/index.js";
import { tensor } from "../protocol/tensor.js";
import { column } from "./batching.js";

export function switchChatTemplate(data: DataProto, src: Tokenizer, target: Tokenizer, maxLength: number | null): DataProto {
  const am = column(data, "attention_mask"), resp = column(data, "responses");
  const [B, T] = am.shape as [number, number];
  const R = resp.shape[1]!;
  const L = maxLength ?? T;
  const raw = data.nonTensorBatch.raw_prompt;
  if (!raw) throw new Error("reward_model.model.input_tokenizer: the batch has no raw_prompt column to re-render for the reward model (its chat template needs the prompt's messages)");
  // verl removes eos_token (its text) from the decoded response; a tokenizer whose eos decodes to "" removes nothing.
  const eosText = src.decode([src.eosTokenId]);
  const ids = new Int32Array(B * L).fill(target.padTokenId);
  const mask = new Int32Array(B * L);
  const pos = new Int32Array(B * L);
  for (let b = 0; b < B; b++) {
    const prompt = raw[b];
    if (!Array.isArray(prompt)) throw new Error(`reward_model.model.input_tokenizer: row ${b}: raw_prompt must be a list of {role, content} messages, got ${typeof prompt}`);
    let len = 0;
    for (let t = T - R; t < T; t++) len += Number(am.data[b * T + t]);
    const responseIds = Array.from(resp.data.subarray(b * R, b * R + len), Number);
    let response = src.decode(responseIds);
    if (eosText !== "") response = response.split(eosText).join("");
    const chat: ChatMessage[] = [...(prompt as ChatMessage[]), { role: "assistant", content: response }];
    let rowIds: number[];
    try {
      rowIds = target.encode(target.applyChatTemplate(chat, { addGenerationPrompt: false }), { addSpecialTokens: false }).slice(0, L);
    } catch (e) {
      throw new Error(`reward_model.model.input_tokenizer: row ${b}: the reward model's tokenizer cannot render or encode the conversation: ${(e as Error).message}`);
    }
    for (let t = 0; t < L; t++) {
      if (t < rowIds.length) {
        ids[b * L + t] = rowIds[t]!;
        mask[b * L + t] = 1;
      }
      // verl's compute_position_id_with_mask: cumsum(mask) - 1, floored at 0 (padding repeats the last position)
      pos[b * L + t] = Math.max(0, Math.min(t, rowIds.length - 1));
    }
  }
  return new DataProto({ input_ids: tensor(ids, [B, L], "int32"), attention_mask: tensor(mask, [B, L], "int32"), position_ids: tensor(pos, [B, L], "int32") }, {}, {});
}
