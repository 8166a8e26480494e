// Remove-padding (verl's model.use_remove_padding): a micro-batch's real tokens
// go back to back in one row, so per-token work (projections, norms, the MLP, the
// vocabulary head) is paid only for real tokens. Attention must not cross from one
// sequence into another; the model runs it per sequence on a right-padded
// [segments, longest] view of the packed rows (gathers both ways), which costs
// what flash-attention's varlen kernels cost: each sequence's own length squared.

export interface PackedRows {
  /** Real tokens of every row, row after row [N]. */
  ids: Int32Array;
  /** Per-token positions (from position_ids, else restarting at 0 per row) [N]. */
  positions: Int32Array;
  /** Real-token count per row (0 for an all-padding row). */
  lengths: Int32Array;
  /** Packed index of column t of row b, or -1 for padding [B*L]. */
  packedIndex: Int32Array;
}

/**
 * Pack the real tokens (mask != 0) of [B, L] rows. `positionIds` [B*L] gives the
 * positions when present (verl computes them as cumsum(mask) - 1 either way).
 */
export function packRows(ids: ArrayLike<number>, mask: ArrayLike<number>, B: number, L: number, positionIds?: ArrayLike<number>): PackedRows {
  if (ids.length !== B * L || mask.length !== B * L) throw new Error(`packRows: input_ids and attention_mask must hold ${B}x${L} values`);
  let n = 0;
  for (let i = 0; i < B * L; i++) if (mask[i]) n++;
  const out: PackedRows = { ids: new Int32Array(n), positions: new Int32Array(n), lengths: new Int32Array(B), packedIndex: new Int32Array(B * L).fill(-1) };
  let at = 0;
  for (let b = 0; b < B; b++) {
    let c = 0;
    for (let t = 0; t < L; t++) {
      const i = b * L + t;
      if (!mask[i]) continue;
      out.ids[at] = ids[i]!;
      out.positions[at] = positionIds ? positionIds[i]! : c;
      out.packedIndex[i] = at++;
      c++;
    }
    out.lengths[b] = c;
  }
  return out;
}

/** The per-sequence attention view of packed rows: right-padded [count, maxLen] and the gathers to and from it. */
export interface SegmentView {
  count: number;
  maxLen: number;
  /** 1 for real slots of the view [count*maxLen]. */
  mask: Int32Array;
  /** For each view slot, the packed row it reads (padding slots read row 0; nothing real ever sees them). */
  toPadded: Int32Array;
  /** For each packed row, its slot in the view. */
  toPacked: Int32Array;
}

export function segmentView(segments: ArrayLike<number>, B: number, T: number): SegmentView {
  if (B !== 1) throw new Error(`packed forward: input_ids must be one row [1, N] when segments are given, got [${B}, ${T}]`);
  let total = 0, maxLen = 1;
  const lens = Array.from(segments).filter((l) => l > 0);
  for (const l of lens) {
    if (!Number.isInteger(l)) throw new Error(`packed forward: segment lengths must be integers, got ${l}`);
    total += l; maxLen = Math.max(maxLen, l);
  }
  if (total !== T) throw new Error(`packed forward: segment lengths sum to ${total}, but input_ids holds ${T} tokens`);
  const count = Math.max(lens.length, 1);
  const v: SegmentView = { count, maxLen, mask: new Int32Array(count * maxLen), toPadded: new Int32Array(count * maxLen), toPacked: new Int32Array(T) };
  let at = 0;
  lens.forEach((l, s) => {
    for (let t = 0; t < l; t++) {
      v.mask[s * maxLen + t] = 1;
      v.toPadded[s * maxLen + t] = at;
      v.toPacked[at++] = s * maxLen + t;
    }
  });
  return v;
}

/** Packed rows plus where each response slot's prediction comes from. */
export interface PackedResponses extends PackedRows {
  /** Packed index of the token before each real response token [M] (its hidden state predicts / values that token). */
  source: Int32Array;
  /** For each response slot [B*R], its index in `source`, or M for padding (which reads a zero). */
  slot: Int32Array;
  /** The real response tokens [M]. */
  labels: Int32Array;
}

/** Pack [B, L] rows whose last R columns are the responses. */
export function packResponses(ids: ArrayLike<number>, mask: ArrayLike<number>, B: number, L: number, R: number, positionIds?: ArrayLike<number>): PackedResponses {
  const rows = packRows(ids, mask, B, L, positionIds), P = L - R;
  const src: number[] = [], labels: number[] = [], slot = new Int32Array(B * R);
  let rowStart = 0;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < R; t++) {
      const at = rows.packedIndex[b * L + P + t]!;
      if (at < 0) { slot[b * R + t] = -1; continue; }
      if (at - 1 < rowStart) {
        throw new Error(`remove-padding: row ${b} has a response token with no real token before it (an empty prompt)`);
      }
      slot[b * R + t] = src.length;
      src.push(at - 1);
      labels.push(ids[b * L + P + t]!);
    }
    rowStart += rows.lengths[b]!;
  }
  for (let i = 0; i < slot.length; i++) if (slot[i]! < 0) slot[i] = src.length;
  return { ...rows, source: Int32Array.from(src), slot, labels: Int32Array.from(labels) };
}
