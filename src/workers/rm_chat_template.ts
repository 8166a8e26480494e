// reward_model.model.input_tokenizer: a reward model whose tokenizer or chat template differs from the
// policy's cannot read the policy's token ids. As verl's RewardModelWorker does (_switch_chat_template),
// each row's response is decoded with the policy's tokenizer, its eos text removed, appended to the
// row's raw_prompt as the assistant turn, rendered with the reward model's chat template (no
// generation prompt) and tokenized for the reward model: right-padded to reward_model.max_length
// (else the batch's sequence width), truncated from the right, positions counted over the mask.
// verl's reward loop (a reward model served by reward_model.rollout.name) renders the same way.
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import { DataProto } from "../protocol/index.js";
import { tensor } from "../protocol/tensor.js";
import { column } from "./batching.js";

/**
 * `served`: the reward model as verl's reward loop serves it (reward_model.rollout.name): the rendered text
 * loses a leading bos text and is tokenized with special tokens, as the server tokenizes it, and is never
 * cut; a row longer than `maxModelLen` is an error, as the server refuses it.
 */
export type SwitchLength = { maxLength: number | null } | { served: true; maxModelLen: number };

export function switchChatTemplate(data: DataProto, src: Tokenizer, target: Tokenizer, length: SwitchLength): DataProto {
  const am = column(data, "attention_mask"), resp = column(data, "responses");
  const [B, T] = am.shape as [number, number];
  const R = resp.shape[1]!;
  const served = "served" in length;
  const bosText = served && target.bosTokenId !== null ? target.decode([target.bosTokenId]) : "";
  const raw = data.nonTensorBatch.raw_prompt;
  if (!raw) throw new Error("reward_model.model.input_tokenizer: the batch has no raw_prompt column to re-render for the reward model (its chat template needs the prompt's messages)");
  // verl removes eos_token (its text) from the decoded response; a tokenizer whose eos decodes to "" removes nothing.
  const eosText = src.decode([src.eosTokenId]);
  const rows: number[][] = [];
  for (let b = 0; b < B; b++) {
    const prompt = raw[b];
    if (!Array.isArray(prompt)) throw new Error(`reward_model.model.input_tokenizer: row ${b}: raw_prompt must be a list of {role, content} messages, got ${typeof prompt}`);
    let len = 0;
    for (let t = T - R; t < T; t++) len += Number(am.data[b * T + t]);
    const responseIds = Array.from(resp.data.subarray(b * R, b * R + len), Number);
    let response = src.decode(responseIds);
    if (eosText !== "") response = response.split(eosText).join("");
    const chat: ChatMessage[] = [...(prompt as ChatMessage[]), { role: "assistant", content: response }];
    try {
      let text = target.applyChatTemplate(chat, { addGenerationPrompt: false });
      if (bosText !== "" && text.startsWith(bosText)) text = text.slice(bosText.length);
      rows.push(target.encode(text, { addSpecialTokens: served }));
    } catch (e) {
      throw new Error(`reward_model.model.input_tokenizer: row ${b}: the reward model's tokenizer cannot render or encode the conversation: ${(e as Error).message}`);
    }
  }
  let L: number;
  if ("served" in length) {
    L = Math.max(1, ...rows.map((r) => r.length));
    const long = rows.findIndex((r) => r.length > length.maxModelLen);
    if (long >= 0) throw new Error(`reward_model.rollout.max_model_len: row ${long}'s conversation is ${rows[long]!.length} tokens for the reward model, more than the ${length.maxModelLen} it takes (verl's reward-model server refuses it)`);
  } else {
    L = length.maxLength ?? T;
  }
  const ids = new Int32Array(B * L).fill(target.padTokenId);
  const mask = new Int32Array(B * L);
  const pos = new Int32Array(B * L);
  for (let b = 0; b < B; b++) {
    const rowIds = rows[b]!.slice(0, L);
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
