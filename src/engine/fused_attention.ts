// Causal grouped-query attention for training on the wasm backend, fused: the
// SIMD kernels (simd/attention_kernel.ts) run directly on the tfjs heap, one query
// token at a time over its visible keys, so no [B, heads, T, T] tensor is ever
// made (memory O(B T d), half the work skipped by causality). The backward pass
// recomputes the probabilities from each row's max and sum, as flash attention does.
// Visible keys must be contiguous per sequence: [keyStart[b], t] for query t
// (left padding, then real tokens; right padding is only ever seen by padding).
import * as tf from "@tensorflow/tfjs";
import { simdSupported } from "./simd/asm.js";
import { buildAttentionBackwardKernel, buildAttentionKernel, type AttentionBackwardKernel, type AttentionKernel } from "./simd/attention_kernel.js";
import type { WasmMemory } from "./simd/wasm_api.js";

interface WasmHeapBackend {
  wasm: { asm?: { memory?: WasmMemory } };
  dataIdMap: { get(dataId: object): { memoryOffset: number } | undefined };
}

export interface FusedAttentionShape {
  batch: number;
  kvHeads: number;
  group: number;
  seqLen: number;
  headDim: number;
}

const kernels = new Map<string, { fwd: AttentionKernel; bwd: AttentionBackwardKernel }>();

function heap(): { be: WasmHeapBackend; memory: WasmMemory } | undefined {
  if (tf.getBackend() !== "wasm") return undefined;
  const be = tf.backend() as unknown as WasmHeapBackend;
  const memory = be.wasm?.asm?.memory;
  return memory ? { be, memory } : undefined;
}

/** Whether the fused path can run here (wasm backend, SIMD, head size a multiple of 4). */
export function fusedAttentionAvailable(headDim: number): boolean {
  return headDim % 4 === 0 && simdSupported() && heap() !== undefined;
}

function kernelsFor(memory: WasmMemory, hd: number, g: number): { fwd: AttentionKernel; bwd: AttentionBackwardKernel } {
  const key = `${hd}/${g}`;
  let k = kernels.get(key);
  if (!k) {
    k = { fwd: buildAttentionKernel(memory, hd, g, 1, { stats: true }), bwd: buildAttentionBackwardKernel(memory, hd, g) };
    kernels.set(key, k);
  }
  return k;
}

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/**
 * softmax(q k^T) v for q [B*kvHeads, T*group, d] (rows (t, j), pre-scaled),
 * k and v [B*kvHeads, T, d]; query t of sequence b sees keys keyStart[b]..t.
 * Queries before keyStart[b] (left padding) get zeros.
 */
export function fusedGroupedAttention(q: tf.Tensor3D, k: tf.Tensor3D, v: tf.Tensor3D, keyStart: Int32Array, s: FusedAttentionShape): tf.Tensor3D {
  const h = heap();
  if (!h) throw new Error("fusedGroupedAttention needs the wasm backend");
  const { be } = h, { fwd, bwd } = kernelsFor(h.memory, s.headDim, s.group);
  const T = s.seqLen, G = s.group, hd = s.headDim, BK = s.batch * s.kvHeads;
  const addr = (t: tf.Tensor) => {
    const info = be.dataIdMap.get(t.dataId);
    if (!info) throw new Error("fusedGroupedAttention: a tensor is not on the wasm backend");
    return info.memoryOffset;
  };
  const rowBytes = hd * 4, qTok = G * hd * 4; // one key row, one query token's G heads
  const attend = tf.customGrad((...args: GradArgs) => {
    const [qs, ks, vs, save] = args as [tf.Tensor3D, tf.Tensor3D, tf.Tensor3D, tf.GradSaveFunc];
    const out = tf.zeros([BK, T * G, hd]) as tf.Tensor3D, m = tf.zeros([BK, T * G]), z = tf.ones([BK, T * G]);
    const scratch = tf.zeros([G * (T + 4)]);
    const [aq, ak, av, ao, am, az, asc] = [qs, ks, vs, out, m, z, scratch].map(addr) as number[];
    for (let bk = 0; bk < BK; bk++) {
      const s0 = keyStart[Math.floor(bk / s.kvHeads)]!, kv0 = (bk * T + s0) * rowBytes;
      for (let t = Math.max(s0, 0); t < T; t++) {
        const tok = (bk * T + t) * qTok;
        fwd.attend(aq! + tok, ak! + kv0, av! + kv0, ao! + tok, asc!, t - s0 + 1, am! + tok / hd, az! + tok / hd);
      }
    }
    scratch.dispose();
    save([qs, ks, vs, out, m, z]);
    return {
      value: out,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
        const [q0, k0, v0, o0, m0, z0] = saved as tf.Tensor[];
        const dO = dy as tf.Tensor;
        const dq = tf.zeros(q0!.shape), dk = tf.zeros(k0!.shape), dv = tf.zeros(v0!.shape), scr = tf.zeros([2 * G * (T + 4)]);
        const [bq, bk_, bv, bdo, bo, bm, bz, bdq, bdk, bdv, bsc] = [q0!, k0!, v0!, dO, o0!, m0!, z0!, dq, dk, dv, scr].map(addr) as number[];
        for (let bk = 0; bk < BK; bk++) {
          const s0 = keyStart[Math.floor(bk / s.kvHeads)]!, kv0 = (bk * T + s0) * rowBytes;
          for (let t = Math.max(s0, 0); t < T; t++) {
            const tok = (bk * T + t) * qTok;
            bwd.backward(bq! + tok, bk_! + kv0, bv! + kv0, bdo! + tok, bo! + tok, bm! + tok / hd, bz! + tok / hd, bdq! + tok, bdk! + kv0, bdv! + kv0, bsc!, t - s0 + 1);
          }
        }
        scr.dispose();
        return [dq, dk, dv];
      },
    };
  });
  return attend(q, k, v) as tf.Tensor3D;
}
