// RMSNorm and SwiGLU with hand-written gradients. Autograd through their
// element-wise formulas keeps five or six activation-sized temporaries per call
// alive until the backward pass (and tfjs's mean gradient adds casts); these keep
// only their inputs and recompute the rest.
import * as tf from "@tensorflow/tfjs";

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/** w * x / sqrt(mean(x^2) + eps) over the last axis; x is [N, D], w is [D]. */
export function rmsNorm(x: tf.Tensor, w: tf.Tensor, eps: number): tf.Tensor {
  const inv = (xs: tf.Tensor) => tf.rsqrt(tf.add(tf.mean(tf.square(xs), -1, true), eps));
  const op = tf.customGrad((...args: GradArgs) => {
    const [xs, ws, save] = args as [tf.Tensor, tf.Tensor, tf.GradSaveFunc];
    save([xs, ws]);
    return {
      value: tf.tidy(() => tf.mul(tf.mul(xs, inv(xs)), ws)),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const [x0, w0] = saved as [tf.Tensor, tf.Tensor];
        const r = inv(x0), g = tf.mul(dy as tf.Tensor, w0);
        // dx = r (g - x r^2 mean(g x)); dw = sum over rows of dy x r
        const dx = tf.mul(r, tf.sub(g, tf.mul(x0, tf.mul(tf.square(r), tf.mean(tf.mul(g, x0), -1, true)))));
        const dw = tf.sum(tf.mul(tf.mul(dy as tf.Tensor, x0), r), 0);
        return [dx, dw];
      }),
    };
  });
  return op(x, w) as tf.Tensor;
}

/** silu(gate) * up for gu = [gate | up] along the last axis of a 2-D tensor. */
export function swiGlu(gu: tf.Tensor2D): tf.Tensor2D {
  const op = tf.customGrad((...args: GradArgs) => {
    const [x, save] = args as [tf.Tensor2D, tf.GradSaveFunc];
    save([x]);
    return {
      value: tf.tidy(() => { const [g, u] = tf.split(x, 2, 1); return tf.mul(tf.mul(g!, tf.sigmoid(g!)), u!); }),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const [g, u] = tf.split(saved[0]!, 2, 1), s = tf.sigmoid(g!), d = dy as tf.Tensor;
        // d silu(g)/dg = s (1 + g (1 - s))
        const dg = tf.mul(tf.mul(d, u!), tf.mul(s, tf.add(1, tf.mul(g!, tf.sub(1, s)))));
        return [tf.concat([dg, tf.mul(d, tf.mul(g!, s))], 1)];
      }),
    };
  });
  return op(gu) as tf.Tensor2D;
}
