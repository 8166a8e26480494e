// Matrix products whose gradients stay on wasm's fast path. The wasm backend
// sends a matmul to XNNPACK only when neither operand is transposed and there is
// no batch dimension; tfjs's own gradient of matMul uses transposed products,
// which fall to a scalar loop about 10x slower. These versions transpose
// explicitly in the backward pass (a training step measured 3x faster).
import * as tf from "@tensorflow/tfjs";
import { frozenStackProduct, packsFrozenStacks } from "./frozen_weights.js";

/** Whether the wasm backend runs (its fast matmul path takes no transposed operand). */
export function onWasm(): boolean {
  return tf.getBackend() === "wasm";
}

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

const linear2d = tf.customGrad((...args: GradArgs) => {
  const [x, w, save] = args as [tf.Tensor2D, tf.Tensor2D, tf.GradSaveFunc];
  save([x, w]);
  return {
    value: tf.matMul(x, tf.transpose(w)),
    gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
      const g = dy as tf.Tensor2D;
      const [xs, ws] = saved as [tf.Tensor2D, tf.Tensor2D];
      return [tf.matMul(g, ws), tf.matMul(tf.transpose(g), xs)];
    },
  };
});

const matmul2d = tf.customGrad((...args: GradArgs) => {
  const [a, b, save] = args as [tf.Tensor2D, tf.Tensor2D, tf.GradSaveFunc];
  save([a, b]);
  return {
    value: tf.matMul(a, b),
    gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
      const g = dy as tf.Tensor2D;
      const [as, bs] = saved as [tf.Tensor2D, tf.Tensor2D];
      return [tf.matMul(g, tf.transpose(bs)), tf.matMul(tf.transpose(as), g)];
    },
  };
});

/**
 * A dense layer without bias: `x @ w^T` for `w` stored [out, in] (PyTorch/HF layout).
 * `x` may have any leading dimensions; the last must equal `in`.
 */
export function linear(x: tf.Tensor, w: tf.Tensor2D): tf.Tensor {
  const [outF, inF] = w.shape;
  const lead = x.shape.slice(0, -1);
  if (x.shape[x.shape.length - 1] !== inF) {
    throw new Error(`linear: input last dim ${x.shape[x.shape.length - 1]} does not match weight [${outF}, ${inF}]`);
  }
  return tf.tidy(() => {
    const x2 = x.reshape([-1, inF]) as tf.Tensor2D;
    const y = onWasm() ? (linear2d(x2, w) as tf.Tensor2D) : tf.matMul(x2, w, false, true);
    return y.reshape([...lead, outF]);
  });
}

/** `a @ b` for 2-D operands, with the fast-path gradient on wasm. */
export function matmul(a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D {
  return onWasm() ? (matmul2d(a, b) as tf.Tensor2D) : tf.matMul(a, b);
}

/**
 * `x @ w^T` where `w` is frozen: the gradient flows to `x` only. On wasm the
 * custom gradient of `linear` computes dW eagerly (a third of the backward work)
 * even when nothing asks for it; here `w` is no input, so no dW is ever made.
 * `w` may be several weights stacked along the output axis (fused q/k/v): the
 * stack is rebuilt in the backward pass rather than kept alive until then.
 */
export function frozenLinear(x: tf.Tensor, w: tf.Tensor2D | tf.Tensor2D[]): tf.Tensor {
  const parts = Array.isArray(w) ? w : [w];
  const stack = (ws: tf.Tensor[]) => (ws.length === 1 ? ws[0]! : tf.concat(ws, 0)) as tf.Tensor2D;
  const inF = parts[0]!.shape[1], outF = parts.reduce((a, p) => a + p.shape[0], 0);
  if (x.shape[x.shape.length - 1] !== inF) {
    throw new Error(`frozenLinear: input last dim ${x.shape[x.shape.length - 1]} does not match weight [${outF}, ${inF}]`);
  }
  // tfjs's own matMul gradient is lazy: an unrequested dW is skipped (and the stack is freed with the
  // tape); under 16-bit products the stack's packed copy is kept instead (frozen_weights.ts)
  if (!onWasm() && !packsFrozenStacks()) return tf.tidy(() => linear(x, stack(parts)));
  const op = tf.customGrad((...args: GradArgs) => {
    const [xs, save] = args as [tf.Tensor2D, tf.GradSaveFunc];
    save(parts); // the weights themselves (they persist), not a temporary stack
    return {
      value: tf.tidy(() => frozenStackProduct(xs, parts, true) ?? tf.matMul(xs, tf.transpose(stack(parts)))),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [tf.tidy(() =>
        frozenStackProduct(dy as tf.Tensor2D, saved as tf.Tensor2D[], false) ?? tf.matMul(dy as tf.Tensor2D, stack(saved)))],
    };
  });
  const lead = x.shape.slice(0, -1);
  return tf.tidy(() => (op(x.reshape([-1, inF])) as tf.Tensor).reshape([...lead, outF]));
}
