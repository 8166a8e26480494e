// The product a LoRA-adapted linear layer computes, fused with its gradient.
import * as tf from "@tensorflow/tfjs";

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/** One output block of a fused LoRA product: its frozen weight and, when adapted, A and B. */
export interface LoraBlock {
  w: tf.Tensor2D;
  a?: tf.Tensor2D;
  b?: tf.Tensor2D;
}

const t2 = (x: tf.Tensor) => tf.transpose(x) as tf.Tensor2D;

/**
 * x [N, in] through blocks stacked along the output axis: x W_j^T + s (x A_j^T) B_j^T
 * for each block j, as one op with a hand-written gradient. Built from tfjs ops, the
 * sums and scalings would keep [N, out]-sized copies for the backward pass (tfjs's
 * Add and Mul gradients save their inputs), so LoRA would cost more activation memory
 * than full fine-tuning; here only x and the (rank-r) adapter weights are kept, and
 * the frozen W_j get no gradient.
 */
export function loraLinear(x: tf.Tensor2D, blocks: LoraBlock[], scale: number): tf.Tensor2D {
  const adapted = blocks.flatMap((bl, j) => (bl.a && bl.b ? [j] : []));
  const ws = blocks.map((bl) => bl.w);
  const stack = (parts: tf.Tensor[]) => (parts.length === 1 ? parts[0]! : tf.concat(parts, 0)) as tf.Tensor2D;
  const sizes = blocks.map((bl) => bl.w.shape[0]);
  const op = tf.customGrad((...args: GradArgs) => {
    const xs = args[0] as tf.Tensor2D, save = args[args.length - 1] as tf.GradSaveFunc;
    const ab = args.slice(1, -1) as tf.Tensor2D[]; // a0, b0, a1, b1, ... for the adapted blocks
    save([xs, ...ab, ...ws]);
    const value = tf.tidy(() => {
      const y = matmulT(xs, stack(ws));
      const deltas = blocks.map((bl, j) => {
        const k = adapted.indexOf(j);
        if (k < 0) return tf.zeros([xs.shape[0], sizes[j]!]);
        return matmulT(matmulT(xs, ab[2 * k]!).mul(scale) as tf.Tensor2D, ab[2 * k + 1]!);
      });
      return tf.add(y, deltas.length === 1 ? deltas[0]! : tf.concat(deltas, 1));
    });
    return {
      value,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const x0 = saved[0] as tf.Tensor2D, sab = saved.slice(1, 1 + ab.length) as tf.Tensor2D[], sw = saved.slice(1 + ab.length);
        const g = dy as tf.Tensor2D;
        let dx = tf.matMul(g, stack(sw));
        const parts = blocks.length === 1 ? [g] : tf.split(g, sizes, 1);
        const grads: tf.Tensor[] = [];
        adapted.forEach((j, k) => {
          const a = sab[2 * k]!, b = sab[2 * k + 1]!, gj = parts[j] as tf.Tensor2D;
          const gb = tf.matMul(gj, b).mul(scale) as tf.Tensor2D; // [N, r]
          dx = dx.add(tf.matMul(gb, a));
          grads.push(tf.matMul(t2(gb), x0)); // dA [r, in]
          grads.push(tf.matMul(t2(gj), matmulT(x0, a).mul(scale) as tf.Tensor2D)); // dB [out, r]
        });
        return [dx, ...grads];
      }),
    };
  });
  const ins: tf.Tensor[] = [x];
  for (const j of adapted) ins.push(blocks[j]!.a!, blocks[j]!.b!);
  return op(...ins) as tf.Tensor2D;
}

/** x @ w^T with an explicit transpose (wasm's fast matmul path takes no transposed operand). */
function matmulT(x: tf.Tensor2D, w: tf.Tensor2D): tf.Tensor2D {
  return tf.matMul(x, t2(w));
}
