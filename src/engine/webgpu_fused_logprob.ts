// Token log-probs and entropy straight from the logits on WebGPU (issue 23). The composite
// (rollout/log_probs.ts) divides by the temperature, takes tf.logSoftmax (max, subtract, exp,
// sum, log, subtract), picks each row's label with a one-hot product and sums p log p for the
// entropy: about a dozen dispatches forward and as many backward, and each an [N, V] tensor. At
// Qwen2.5's vocabulary (151,936) and a 4,096-token micro-batch one such tensor is 2.5 GB, the
// one-hot included. Here:
//   forward   one workgroup a row: an online max / sum of exp / sum of exp * z / sum of exp^2 over
//             the row, then log p(label) = z_label - lse, the entropy H = lse - sum(p z) and
//             S = sum(p^2): a [4, N] result (log-prob, entropy, S, lse), z = logits / temperature
//   backward  one thread an element: dz = dlogp (1[j = label] - p) - dH p (log p + H)
//             + dS 2 p (p - S), / temperature
// Two dispatches and no [N, V] temporary but the gradient itself. A label outside [0, V) reads 0
// and passes no gradient, as the one-hot product gives. Every reduction runs in a fixed order (no atomics).
import * as tf from "@tensorflow/tfjs";
import { splitRows } from "./copies.js";
import { FusedProgram, fusedLayersFor, int, registerWebGPUKernels, run, type Kernel } from "./webgpu_fused.js";
import type { UniformValue } from "../rollout/webgpu_programs.js";

const WG = 256;
const f32 = (x: number): UniformValue => ({ type: "float32", data: [x] });

/** [4, N]: per row log p(label), entropy, sum of p^2, logsumexp of z = logits * invT. */
class TokenLogProbForward extends FusedProgram {
  variableNames = ["z", "labels"];
  uniforms = "nRows : i32, invT : f32,";
  constructor(private readonly N: number, private readonly V: number) {
    super([4, N], `verlTokenLogProbFwd_${V}`, WG, N);
  }
  getUserCode(): string {
    const V = this.V;
    return `
      var<workgroup> wm : array<f32, ${WG}>;
      var<workgroup> ws : array<f32, ${WG}>;
      var<workgroup> wt : array<f32, ${WG}>;
      var<workgroup> wu : array<f32, ${WG}>;
      fn main(index : i32) {
        let row = index / ${WG};
        let tid = i32(localIndex);
        // online: m the running max, s = sum exp(v - m), t = sum exp(v - m) v, u = sum exp(v - m)^2
        var m = -3.402823e38;
        var s = 0.0;
        var t = 0.0;
        var u = 0.0;
        if (row < uniforms.nRows) {
          for (var d = tid; d < ${V}; d = d + ${WG}) {
            let v = z[row * ${V} + d] * uniforms.invT;
            if (v > m) {
              let c = exp(m - v);
              s = s * c;
              t = t * c;
              u = u * c * c;
              m = v;
            }
            let e = exp(v - m);
            s = s + e;
            t = t + e * v;
            u = u + e * e;
          }
        }
        wm[tid] = m;
        ws[tid] = s;
        wt[tid] = t;
        wu[tid] = u;
        workgroupBarrier();
        for (var k = ${WG / 2}; k > 0; k = k >> 1u) {
          if (tid < k) {
            let m1 = wm[tid];
            let m2 = wm[tid + k];
            let mm = max(m1, m2);
            let c1 = select(exp(m1 - mm), 0.0, ws[tid] == 0.0);
            let c2 = select(exp(m2 - mm), 0.0, ws[tid + k] == 0.0);
            ws[tid] = ws[tid] * c1 + ws[tid + k] * c2;
            wt[tid] = wt[tid] * c1 + wt[tid + k] * c2;
            wu[tid] = wu[tid] * c1 * c1 + wu[tid + k] * c2 * c2;
            wm[tid] = mm;
          }
          workgroupBarrier();
        }
        if (tid == 0 && row < uniforms.nRows) {
          let lse = wm[0] + log(ws[0]);
          let label = labels[row];
          var lp = 0.0;
          if (label >= 0 && label < ${V}) { lp = z[row * ${V} + label] * uniforms.invT - lse; }
          result[row] = lp;
          result[uniforms.nRows + row] = lse - wt[0] / ws[0];
          result[2 * uniforms.nRows + row] = wu[0] / (ws[0] * ws[0]);
          result[3 * uniforms.nRows + row] = lse;
        }
      }`;
  }
}

/** dlogits [N, V] from dy [3, N] (d log-prob, d entropy, d sum p^2) and the forward's stats. */
class TokenLogProbGrad extends FusedProgram {
  variableNames = ["z", "labels", "stats", "dy"];
  uniforms = "nRows : i32, invT : f32,";
  constructor(private readonly N: number, private readonly V: number) {
    super([N, V], `verlTokenLogProbGrad_${V}`, WG, Math.ceil((N * V) / WG));
  }
  getUserCode(): string {
    const V = this.V;
    return `
      fn main(index : i32) {
        let n = uniforms.nRows;
        if (index < n * ${V}) {
          let row = index / ${V};
          let j = index - row * ${V};
          let logp = z[index] * uniforms.invT - stats[3 * n + row];
          let p = exp(logp);
          let label = labels[row];
          let hit = select(0.0, 1.0, label == j);
          // a label outside the vocabulary read 0, a constant: its log-prob passes no gradient
          let dlp = select(0.0, dy[row], label >= 0 && label < ${V});
          let g = dlp * (hit - p) - dy[n + row] * p * (logp + stats[n + row]) + dy[2 * n + row] * 2.0 * p * (p - stats[2 * n + row]);
          result[index] = g * uniforms.invT;
        }
      }`;
  }
}

const KERNELS: Record<string, Kernel> = {
  VerlTokenLogProbs: ({ inputs: { z, labels }, backend, attrs }) => {
    const [N, V] = z!.shape as [number, number];
    return backend.runWebGPUProgram(new TokenLogProbForward(N, V), [z!, labels!], "float32", [int(N), f32(attrs.invT as number)]);
  },
  VerlTokenLogProbsGrad: ({ inputs: { z, labels, stats, dy }, backend, attrs }) => {
    const [N, V] = z!.shape as [number, number];
    return backend.runWebGPUProgram(new TokenLogProbGrad(N, V), [z!, labels!, stats!, dy!], "float32", [int(N), f32(attrs.invT as number)]);
  },
};

let registered = false;

/** Whether the fused kernels take these logits (float32 [N, V] on WebGPU, fused kernels on; VERL_WEBGPU_FUSED_LOGPROB=0: the composite). */
export function fusedLogProbsFor(logits: tf.Tensor): boolean {
  if (process.env.VERL_WEBGPU_FUSED_LOGPROB === "0" || logits.rank !== 2 || !fusedLayersFor(logits)) return false;
  if (!registered) {
    registerWebGPUKernels(KERNELS);
    registered = true;
  }
  return true;
}

/**
 * log softmax(logits / temperature)[label], the entropy and Σπ² of softmax(logits / temperature)
 * per row of logits [N, V] (labels [N] int32), all differentiable: three [N] tensors.
 */
export function fusedTokenLogProbs(logits: tf.Tensor2D, labels: tf.Tensor1D, temperature = 1): { logProbs: tf.Tensor1D; entropy: tf.Tensor1D; sumPiSquared: tf.Tensor1D } {
  if (!fusedLogProbsFor(logits)) throw new Error("fusedTokenLogProbs: needs float32 [N, V] logits on the webgpu backend with the fused kernels on");
  const [N] = logits.shape;
  if (labels.shape[0] !== N || labels.dtype !== "int32") throw new Error(`fusedTokenLogProbs: labels must be int32 [${N}], got ${labels.dtype} [${labels.shape}]`);
  if (!(temperature > 0)) throw new Error(`fusedTokenLogProbs: temperature must be > 0, got ${temperature}`);
  if (logits.size >= 2 ** 31) {
    throw new Error(`fusedTokenLogProbs: logits of ${N} tokens x ${logits.shape[1]} vocabulary = ${logits.size} values, past the 2^31 a WebGPU kernel indexes; ` +
      "lower the micro-batch's tokens (ppo_micro_batch_size_per_gpu, or ppo_max_token_len_per_gpu with use_dynamic_bsz)");
  }
  const invT = 1 / temperature;
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const [z, save] = args as [tf.Tensor2D, tf.GradSaveFunc];
    const stats = run("VerlTokenLogProbs", { z, labels }, { invT });
    save([z, stats, labels]); // labels too: the caller's may be gone by the backward pass
    // the value is the first three rows (log-prob, entropy, Σπ²); the lse row stays with the saved stats
    const [value, lse] = splitRows(stats, [3, 1]);
    lse!.dispose();
    return {
      value: value!,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [run("VerlTokenLogProbsGrad", { z: saved[0]!, labels: saved[2]!, stats: saved[1]!, dy: dy as tf.Tensor }, { invT })],
    };
  });
  const rows = op(logits) as tf.Tensor2D;
  const [logProbs, entropy, sumPiSquared] = splitRows(rows, [1, 1, 1]).map((r) => r.reshape([N]) as tf.Tensor1D);
  rows.dispose();
  return { logProbs: logProbs!, entropy: entropy!, sumPiSquared: sumPiSquared! };
}
