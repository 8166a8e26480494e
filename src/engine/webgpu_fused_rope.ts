// Fused rotary embedding on WebGPU (issue 23): y = x cos + rotate_half(x) sin over x [N, heads, hd]
// with cos/sin [N, 1, hd], in one dispatch; its gradient dx = dy cos + rotate_half^T(dy sin) in one
// more (cos and sin are constants: no gradient). The composite (models/rope.ts applyRope) takes a
// product with the rotate_half matrix, two multiplies and an add forward, about as many backward.
// rotate_half(x)[d] = -x[d + hd/2] below hd/2, x[d - hd/2] above; its transpose moves the other way
// with the other sign. One invocation an element; no reductions, so the same inputs give the same bits.
// Taken under the same switch as the other fused kernels (webgpu_fused.ts: fusedLayersFor).
import type * as tf from "@tensorflow/tfjs";
import { FusedProgram, fusedLayersFor, int, registerWebGPUKernels, run, rowsOf, type Kernel } from "./webgpu_fused.js";

/** Forward (x) or backward (dy) over [N, H, hd]; cos/sin are read at row n = index / (H hd). */
class RopeProgram extends FusedProgram {
  variableNames: string[];
  uniforms = "total : i32,";
  constructor(outputShape: number[], private readonly H: number, private readonly hd: number, private readonly backward: boolean) {
    super(outputShape, `verlFusedRope_${H}_${hd}_${backward ? "grad" : "fwd"}`, 256, Math.ceil((rowsOf(outputShape) * hd) / 256));
    this.variableNames = [backward ? "dy" : "x", "cosT", "sinT"];
  }
  getUserCode(): string {
    const hd = this.hd, h = hd / 2;
    const body = this.backward ? `
          var t = 0.0;
          if (d < ${h}) { t = dy[index + ${h}] * sinT[c + ${h}]; } else { t = -(dy[index - ${h}] * sinT[c - ${h}]); }
          result[index] = dy[index] * cosT[c] + t;` : `
          var r = 0.0;
          if (d < ${h}) { r = -x[index + ${h}]; } else { r = x[index - ${h}]; }
          result[index] = x[index] * cosT[c] + r * sinT[c];`;
    return `
      fn main(index : i32) {
        if (index < uniforms.total) {
          let d = index % ${hd};
          let c = (index / ${this.H * hd}) * ${hd} + d;${body}
        }
      }`;
  }
}

const KERNELS: Record<string, Kernel> = {
  VerlRope: ({ inputs: { x, cos, sin }, backend }) => {
    const [, H, hd] = x!.shape as [number, number, number];
    return backend.runWebGPUProgram(new RopeProgram(x!.shape, H, hd, false), [x!, cos!, sin!], "float32", [int(rowsOf(x!.shape) * hd)]);
  },
  VerlRopeGrad: ({ inputs: { dy, cos, sin }, backend }) => {
    const [, H, hd] = dy!.shape as [number, number, number];
    return backend.runWebGPUProgram(new RopeProgram(dy!.shape, H, hd, true), [dy!, cos!, sin!], "float32", [int(rowsOf(dy!.shape) * hd)]);
  },
};

let registered = false;

/**
 * Whether the fused rope should run for x [N, H, hd] and cos/sin [N, 1, hd]: the fused switch is on,
 * the backend is webgpu, everything is float32 and the shapes are those (hd even).
 */
export function fusedRopeFor(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor): boolean {
  const [N, , hd] = x.shape;
  const table = (t: tf.Tensor) => t.rank === 3 && t.shape[0] === N && t.shape[1] === 1 && t.shape[2] === hd;
  if (x.rank !== 3 || hd! % 2 !== 0 || !table(cos) || !table(sin) || !fusedLayersFor(x, cos, sin)) return false;
  if (!registered) {
    registerWebGPUKernels(KERNELS);
    registered = true;
  }
  return true;
}

/** x cos + rotate_half(x) sin: one dispatch. */
export const fusedRope = (x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor): tf.Tensor => run("VerlRope", { x, cos, sin });

/** Its gradient with respect to x, dy cos + rotate_half^T(dy sin): one dispatch. */
export const fusedRopeGrad = (dy: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor): tf.Tensor => run("VerlRopeGrad", { dy, cos, sin });
