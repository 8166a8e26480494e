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

/**
 * For each of nb rows of P prompt columns, the first row with the same ids, mask and
 * positions (itself when none before it has them): verl repeats each prompt rollout.n times.
 */
export function samePromptSource(ids: Int32Array, mask: Int32Array, pos: Int32Array, nb: number, P: number): Int32Array {
  const source = new Int32Array(nb), byHash = new Map<number, number[]>();
  const same = (a: number, b: number) => {
    for (let s = 0; s < P; s++) {
      const x = a * P + s, y = b * P + s;
      if (ids[x] !== ids[y] || mask[x] !== mask[y] || pos[x] !== pos[y]) return false;
    }
    return true;
  };
  for (let b = 0; b < nb; b++) {
    let h = 0x811c9dc5; // FNV-1a over the row's three columns
    for (let s = b * P; s < (b + 1) * P; s++) h = Math.imul(h ^ ids[s]! ^ (mask[s]! << 30) ^ Math.imul(pos[s]!, 0x9e3779b1), 16777619);
    const seen = byHash.get(h);
    const first = seen?.find((a) => same(a, b));
    source[b] = first ?? b;
    if (first === undefined) (seen ?? byHash.set(h, []).get(h)!).push(b);
  }
  return source;
}
