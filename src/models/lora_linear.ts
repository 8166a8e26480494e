// The product a LoRA-adapted linear layer computes, fused with its gradient: plain LoRA, DoRA
// (a trained magnitude per output row), and dropout on the adapter branch.
import * as tf from "@tensorflow/tfjs";
import { onWasm } from "../engine/matmul.js";

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/** One output block of a fused LoRA product: its frozen weight and, when adapted, A and B. */
export interface LoraBlock {
  w: tf.Tensor2D;
  a?: tf.Tensor2D;
  b?: tf.Tensor2D;
  /**
   * DoRA: the magnitude m [out] (trained) and the row norms ||W + s B A|| [out], a constant: the
   * norm is detached from the gradient, as peft and Megatron-Bridge do (DoRA paper, section 4.3).
   */
  magnitude?: tf.Tensor1D;
  weightNorm?: tf.Tensor1D;
  /** Adapter dropout, as keep-masks already scaled by 1 / (1 - p): `dropIn` [N, in] on the branch's input (pre), `dropOut` [N, out] on its output (post). */
  dropIn?: tf.Tensor2D;
  dropOut?: tf.Tensor2D;
}

const t2 = (x: tf.Tensor) => tf.transpose(x) as tf.Tensor2D;

/**
 * x [N, in] through blocks stacked along the output axis, as one op with a hand-written gradient.
 * Per adapted block j, with xd = x (masked by dropIn when given) and l = s (xd A^T) B^T (masked by
 * dropOut when given):
 *   LoRA: x W^T + l
 *   DoRA: x W^T + (c - 1) (xd W^T) + c l, c = m / ||W + s B A|| per output row
 * (peft's form; without dropout DoRA is c (x W^T + l) = m (W + s B A) / ||W + s B A|| x.)
 * Built from tfjs ops, the sums and scalings would keep [N, out]-sized copies for the backward
 * pass (tfjs's Add and Mul gradients save their inputs), so LoRA would cost more activation
 * memory than full fine-tuning; here only x, the adapter weights and the masks are kept, and the
 * frozen W_j get no gradient.
 */
export function loraLinear(x: tf.Tensor2D, blocks: LoraBlock[], scale: number): tf.Tensor2D {
  const adapted = blocks.flatMap((bl, j) => (bl.a && bl.b ? [j] : []));
  // where each adapted block's inputs start among the op's differentiable inputs (after x): a, b[, m]
  const at: number[] = [];
  let n = 1;
  for (const j of adapted) { at.push(n); n += blocks[j]!.magnitude ? 3 : 2; }
  const ws = blocks.map((bl) => bl.w);
  const consts = blocks.flatMap((bl) => [bl.weightNorm, bl.dropIn, bl.dropOut].flatMap((t): tf.Tensor[] => (t ? [t] : [])));
  const stack = (parts: tf.Tensor[]) => (parts.length === 1 ? parts[0]! : tf.concat(parts, 0)) as tf.Tensor2D;
  const sizes = blocks.map((bl) => bl.w.shape[0]);
  /** The adapter branch of block j: xd and l (both [N, *]), and DoRA's c [out] when it has one. */
  const branch = (xs: tf.Tensor2D, bl: LoraBlock, a: tf.Tensor2D, b: tf.Tensor2D, m: tf.Tensor | undefined) => {
    const xd = bl.dropIn ? (tf.mul(xs, bl.dropIn) as tf.Tensor2D) : xs;
    const h = matmulT(xd, a);
    const c = m && bl.weightNorm ? tf.div(m, bl.weightNorm) : undefined;
    // l [N, out] is needed in the backward pass only by DoRA's dm: computed on demand there
    const branchOut = () => {
      const l = matmulT(h, b).mul(scale) as tf.Tensor2D;
      return bl.dropOut ? (tf.mul(l, bl.dropOut) as tf.Tensor2D) : l;
    };
    return { xd, h, c, branchOut };
  };
  const op = tf.customGrad((...args: GradArgs) => {
    const xs = args[0] as tf.Tensor2D, save = args[args.length - 1] as tf.GradSaveFunc;
    const ins = args.slice(0, -1) as tf.Tensor[];
    save([...ins, ...ws, ...consts]);
    const value = tf.tidy(() => {
      const y = matmulT(xs, stack(ws));
      const deltas = blocks.map((bl, j) => {
        const k = adapted.indexOf(j);
        if (k < 0) return tf.zeros([xs.shape[0], sizes[j]!]);
        const i = at[k]!, m = bl.magnitude ? ins[i + 2] : undefined;
        const { xd, c, branchOut } = branch(xs, bl, ins[i] as tf.Tensor2D, ins[i + 1] as tf.Tensor2D, m);
        const l = branchOut();
        if (!c) return l;
        // (c - 1) xd W^T + c l, added to the base x W^T
        return tf.add(tf.mul(matmulT(xd, bl.w), tf.sub(c, 1)), tf.mul(l, c));
      });
      return tf.add(y, deltas.length === 1 ? deltas[0]! : tf.concat(deltas, 1));
    });
    return {
      value,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const x0 = saved[0] as tf.Tensor2D, sin = saved.slice(0, n), sw = saved.slice(n, n + ws.length) as tf.Tensor2D[];
        const g = dy as tf.Tensor2D;
        let dx = tf.matMul(g, stack(sw));
        const parts = blocks.length === 1 ? [g] : tf.split(g, sizes, 1);
        const grads: tf.Tensor[] = [];
        adapted.forEach((j, k) => {
          const bl = blocks[j]!, i = at[k]!, gj = parts[j] as tf.Tensor2D;
          const a = sin[i] as tf.Tensor2D, b = sin[i + 1] as tf.Tensor2D, m = bl.magnitude ? sin[i + 2] : undefined;
          const { xd, h, c, branchOut } = branch(x0, bl, a, b, m);
          let gl = c ? (tf.mul(gj, c) as tf.Tensor2D) : gj; // dL/dl
          if (bl.dropOut) gl = tf.mul(gl, bl.dropOut) as tf.Tensor2D;
          const gh = tf.matMul(gl, b).mul(scale) as tf.Tensor2D; // [N, r]
          let dxd = tf.matMul(gh, a);
          if (c) dxd = dxd.add(tf.matMul(tf.mul(gj, tf.sub(c, 1)), sw[j]!)); // through (c - 1) xd W^T
          dx = dx.add(bl.dropIn ? tf.mul(dxd, bl.dropIn) : dxd);
          grads.push(matmulTN(gh, xd)); // dA [r, in]
          grads.push(matmulTN(gl, h).mul(scale)); // dB [out, r]
          // dm: y depends on m through c = m / n: dy/dm = (xd W^T + l) / n per output row
          if (c) grads.push(tf.sum(tf.mul(gj, tf.add(matmulT(xd, sw[j]!), branchOut())), 0).div(bl.weightNorm!));
        });
        return [dx, ...grads];
      }),
    };
  });
  const ins: tf.Tensor[] = [x];
  for (const j of adapted) {
    const bl = blocks[j]!;
    ins.push(bl.a!, bl.b!);
    if (bl.magnitude) {
      if (!bl.weightNorm) throw new Error("loraLinear: a DoRA block needs weightNorm beside its magnitude");
      ins.push(bl.magnitude);
    }
  }
  return op(...ins) as tf.Tensor2D;
}

/**
 * x @ w^T. On wasm with an explicit transpose (its fast matmul path takes no transposed operand);
 * elsewhere as a transposed product: the GPU's kernels read w^T in place, where an explicit
 * transpose would copy every frozen weight on every pass.
 */
function matmulT(x: tf.Tensor2D, w: tf.Tensor2D): tf.Tensor2D {
  return onWasm() ? tf.matMul(x, t2(w)) : tf.matMul(x, w, false, true);
}

/** g^T @ x, as matmulT chooses between an explicit and an in-place transpose. */
function matmulTN(g: tf.Tensor2D, x: tf.Tensor2D): tf.Tensor2D {
  return onWasm() ? tf.matMul(t2(g), x) : tf.matMul(g, x, true, false);
}
