// Left-padded prompt batches from token-id lists, in verl's layout.
import { DataProto } from "../protocol/data_proto.js";
import { tensor } from "../protocol/tensor.js";

/**
 * input_ids / attention_mask / position_ids [B, P] with every prompt left-padded
 * to the longest (or to `length`, which must fit them all).
 */
export function leftPadPrompts(prompts: number[][], padTokenId: number, length?: number): DataProto {
  const B = prompts.length;
  if (B === 0) throw new Error("leftPadPrompts: no prompts");
  const P = length ?? Math.max(...prompts.map((p) => p.length));
  const ids = new Int32Array(B * P).fill(padTokenId), mask = new Int32Array(B * P), pos = new Int32Array(B * P);
  prompts.forEach((p, b) => {
    if (p.length > P) throw new Error(`leftPadPrompts: prompt ${b} has ${p.length} tokens, more than the length ${P}`);
    const off = P - p.length;
    p.forEach((t, i) => { ids[b * P + off + i] = t; mask[b * P + off + i] = 1; pos[b * P + off + i] = i; });
  });
  return new DataProto({
    input_ids: tensor(ids, [B, P], "int32"),
    attention_mask: tensor(mask, [B, P], "int32"),
    position_ids: tensor(pos, [B, P], "int32"),
  });
}
