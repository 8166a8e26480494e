// The decoder's key/value cache: per layer [rows, kvHeads, maxLen, headDim],
// written in place, with a validity flag per (row, column) for padding. It also
// runs attention over itself: a WebAssembly SIMD kernel (engine/simd) where the
// runtime has SIMD and a row's visible columns are contiguous (always, for
// left-padded prompts), else a plain JS loop that honours every flag.
import type { SimdArena } from "../engine/simd/arena.js";
import { buildAttentionKernel, type AttentionKernel } from "../engine/simd/attention_kernel.js";
import type { ModelConfig } from "../models/config.js";

interface SimdState {
  arena: SimdArena;
  kernel: AttentionKernel;
  /** byte offsets of the layers' K/V, the q staging area, the output staging area and the scores scratch */
  kvAt: number[]; qAt: number; oAt: number; scAt: number;
}

export class KvCache {
  readonly k: Float32Array[] = [];
  readonly v: Float32Array[] = [];
  /** valid[b * maxLen + slot]: the column holds a real token that may be attended to. */
  readonly valid: Uint8Array;
  /** The first valid column of each row (maxLen when none). */
  readonly firstValid: Int32Array;
  private readonly simd?: SimdState;
  private readonly scores: Float64Array;
  private readonly perLayer: number;

  /** The floats (and regions) a SIMD arena needs to hold this cache. */
  static arenaNeeds(c: ModelConfig, batch: number, maxLen: number, maxRows: number): { floats: number; regions: number } {
    const hd = c.headDim, W = (c.nHeads + 2 * c.nKvHeads) * hd, Q = c.nHeads * hd;
    return { floats: 2 * c.nLayers * batch * c.nKvHeads * maxLen * hd + maxRows * (W + Q) + (c.nHeads / c.nKvHeads) * (maxLen + 4), regions: 2 * c.nLayers + 3 };
  }

  /** With an arena (sized by arenaNeeds) and a head size divisible by 4, attention runs in the SIMD kernel. */
  constructor(private readonly c: ModelConfig, readonly batch: number, readonly maxLen: number, maxRows: number, arena?: SimdArena) {
    const hd = c.headDim, W = (c.nHeads + 2 * c.nKvHeads) * hd, Q = c.nHeads * hd;
    this.perLayer = batch * c.nKvHeads * maxLen * hd;
    this.valid = new Uint8Array(batch * maxLen);
    this.firstValid = new Int32Array(batch).fill(maxLen);
    this.scores = new Float64Array(maxLen);
    if (arena && hd % 4 === 0) {
      const kvAt: number[] = [];
      for (let l = 0; l < c.nLayers; l++) {
        const kAt = arena.take(this.perLayer), vAt = arena.take(this.perLayer);
        kvAt.push(kAt, vAt);
        this.k.push(arena.view(kAt, this.perLayer));
        this.v.push(arena.view(vAt, this.perLayer));
      }
      const qAt = arena.take(maxRows * W), oAt = arena.take(maxRows * Q), scAt = arena.take((c.nHeads / c.nKvHeads) * (maxLen + 4));
      this.simd = { arena, kernel: buildAttentionKernel(arena.memory, hd, c.nHeads / c.nKvHeads, 1 / Math.sqrt(hd)), kvAt, qAt, oAt, scAt };
    } else {
      for (let l = 0; l < c.nLayers; l++) { this.k.push(new Float32Array(this.perLayer)); this.v.push(new Float32Array(this.perLayer)); }
    }
  }

  get usesSimd(): boolean {
    return this.simd !== undefined;
  }

  /** Forget what row b holds. */
  reset(b: number): void {
    this.truncate(b, 0);
  }

  /** Keep only the first `len` columns of row b (0 forgets the row). */
  truncate(b: number, len: number): void {
    this.valid.fill(0, b * this.maxLen + len, (b + 1) * this.maxLen);
    if (this.firstValid[b]! >= len) this.firstValid[b] = this.maxLen;
  }

  /** Row dst becomes a copy of row src (every layer's k and v, the validity flags): prefix sharing. */
  copyRow(dst: number, src: number): void {
    const row = this.perLayer / this.batch;
    for (const a of [...this.k, ...this.v]) a.copyWithin(dst * row, src * row, (src + 1) * row);
    this.valid.copyWithin(dst * this.maxLen, src * this.maxLen, (src + 1) * this.maxLen);
    this.firstValid[dst] = this.firstValid[src]!;
  }

  mark(b: number, slot: number, valid: boolean): void {
    this.valid[b * this.maxLen + slot] = valid ? 1 : 0;
    if (valid && slot < this.firstValid[b]!) this.firstValid[b] = slot;
  }

  /**
   * Attention of N = rows x T new tokens (q in `qkv` rows of width W, scaled so that
   * q k / sqrt(headDim) is the score) over the valid columns up to each token's own
   * column; writes out [N, Q]. With `window`, only the window - 1 columns before a
   * token's own are seen (sliding-window layers); `softcap` caps scores at cap * tanh(s / cap).
   */
  attend(l: number, qkv: Float32Array, out: Float32Array, rows: Int32Array, slotStart: Int32Array, T: number, window: number | null = null, softcap: number | null = null): void {
    const c = this.c, hd = c.headDim, W = (c.nHeads + 2 * c.nKvHeads) * hd, Q = c.nHeads * hd, g = c.nHeads / c.nKvHeads;
    const N = rows.length * T, simd = this.simd;
    let heap: Float32Array | undefined;
    if (simd) {
      heap = new Float32Array(simd.arena.memory.buffer);
      heap.set(qkv.subarray(0, N * W), simd.qAt / 4);
    }
    for (let r = 0; r < rows.length; r++) {
      const b = rows[r]!;
      for (let t = 0; t < T; t++) {
        const n = r * T + t, qs = slotStart[r]! + t;
        const s0 = window === null ? this.firstValid[b]! : Math.max(this.firstValid[b]!, qs - window + 1);
        if (simd && softcap === null && s0 <= qs && this.contiguous(b, s0, qs)) {
          for (let j = 0; j < c.nKvHeads; j++) {
            const kv = 4 * (((b * c.nKvHeads + j) * this.maxLen + s0) * hd);
            simd.kernel.attend(simd.qAt + 4 * (n * W + j * g * hd), simd.kvAt[2 * l]! + kv, simd.kvAt[2 * l + 1]! + kv,
              simd.oAt + 4 * (n * Q + j * g * hd), simd.scAt, qs - s0 + 1);
          }
          out.set(heap!.subarray(simd.oAt / 4 + n * Q, simd.oAt / 4 + (n + 1) * Q), n * Q);
        } else {
          this.attendJs(l, qkv, out, b, n, s0, qs, softcap);
        }
      }
    }
  }

  private contiguous(b: number, s0: number, qs: number): boolean {
    const row = b * this.maxLen;
    for (let s = s0; s <= qs; s++) if (!this.valid[row + s]) return false;
    return true;
  }

  /** One token's attention in plain JS, skipping invalid columns. */
  private attendJs(l: number, qkv: Float32Array, out: Float32Array, b: number, n: number, s0: number, qs: number, softcap: number | null): void {
    const c = this.c, hd = c.headDim, g = c.nHeads / c.nKvHeads, W = (c.nHeads + 2 * c.nKvHeads) * hd, Q = c.nHeads * hd;
    const K = this.k[l]!, V = this.v[l]!, sc = this.scores, scale = 1 / Math.sqrt(hd), vrow = b * this.maxLen;
    for (let head = 0; head < c.nHeads; head++) {
      const kvBase = (b * c.nKvHeads + Math.floor(head / g)) * this.maxLen * hd;
      const qo = n * W + head * hd, oo = n * Q + head * hd;
      let max = -Infinity;
      for (let s = s0; s <= qs; s++) {
        if (!this.valid[vrow + s]) { sc[s] = -Infinity; continue; }
        const ko = kvBase + s * hd;
        let dot = 0;
        for (let d = 0; d < hd; d++) dot += qkv[qo + d]! * K[ko + d]!;
        sc[s] = softcap === null ? dot * scale : softcap * Math.tanh((dot * scale) / softcap);
        if (sc[s]! > max) max = sc[s]!;
      }
      out.fill(0, oo, oo + hd);
      if (max === -Infinity) continue; // a padding column with nothing to see: its output is never used
      let den = 0;
      for (let s = s0; s <= qs; s++) { const e = sc[s] === -Infinity ? 0 : Math.exp(sc[s]! - max); sc[s] = e; den += e; }
      for (let s = s0; s <= qs; s++) {
        const p = sc[s]! / den;
        if (p === 0) continue;
        const vo = kvBase + s * hd;
        for (let d = 0; d < hd; d++) out[oo + d]! += p * V[vo + d]!;
      }
    }
  }
}
