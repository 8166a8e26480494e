// RMSNorm and SwiGLU with hand-written gradients. Autograd through their
// element-wise formulas keeps five or six activation-sized temporaries per call
// alive until the backward pass (and tfjs's mean gradient adds casts); these keep
// only their inputs and recompute the rest. On the webgpu backend each runs as one to three
// fused kernels (engine/webgpu_fused.ts) instead of 5-15 tfjs dispatches; elsewhere the
// composites below run unchanged.
import * as tf from "@tensorflow/tfjs";
import { constScalar as k } from "../engine/constants.js";
import { fusedGlu, fusedGluGrad, fusedLayersFor, fusedRmsNorm, fusedRmsNormGrad, type GatedActivation } from "../engine/webgpu_fused.js";

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/** w * x / sqrt(mean(x^2) + eps) over the last axis; x is [N, D], w is [D]. */
export function rmsNorm(x: tf.Tensor, w: tf.Tensor, eps: number): tf.Tensor {
  if (fusedLayersFor(x, w)) return fusedRmsNormOp(x, w, eps);
  const inv = (xs: tf.Tensor) => tf.rsqrt(tf.add(tf.mean(tf.square(xs), -1, true), k(eps)));
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
  if (fusedLayersFor(gu)) return fusedGluOp(gu, "silu");
  const op = tf.customGrad((...args: GradArgs) => {
    const [x, save] = args as [tf.Tensor2D, tf.GradSaveFunc];
    save([x]);
    return {
      value: tf.tidy(() => { const [g, u] = tf.split(x, 2, 1); return tf.mul(tf.mul(g!, tf.sigmoid(g!)), u!); }),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const [g, u] = tf.split(saved[0]!, 2, 1), s = tf.sigmoid(g!), d = dy as tf.Tensor;
        // d silu(g)/dg = s (1 + g (1 - s))
        const dg = tf.mul(tf.mul(d, u!), tf.mul(s, tf.add(k(1), tf.mul(g!, tf.sub(k(1), s)))));
        return [tf.concat([dg, tf.mul(d, tf.mul(g!, s))], 1)];
      }),
    };
  });
  return op(gu) as tf.Tensor2D;
}

function fusedRmsNormOp(x: tf.Tensor, w: tf.Tensor, eps: number): tf.Tensor {
  const op = tf.customGrad((...args: GradArgs) => {
    const [xs, ws, save] = args as [tf.Tensor, tf.Tensor, tf.GradSaveFunc];
    save([xs, ws]);
    return {
      value: fusedRmsNorm(xs, ws, eps),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => fusedRmsNormGrad(dy as tf.Tensor, saved[0]!, saved[1]!, eps),
    };
  });
  return op(x, w) as tf.Tensor;
}

function fusedGluOp(gu: tf.Tensor2D, act: GatedActivation): tf.Tensor2D {
  const op = tf.customGrad((...args: GradArgs) => {
    const [x, save] = args as [tf.Tensor2D, tf.GradSaveFunc];
    save([x]);
    return { value: fusedGlu(x, act), gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => [fusedGluGrad(dy as tf.Tensor, saved[0]!, act)] };
  });
  return op(gu) as tf.Tensor2D;
}

/** sqrt(2/pi) and the cubic term of PyTorch's tanh-approximated GELU (gelu_pytorch_tanh). */
const GELU_BETA = Math.sqrt(2 / Math.PI), GELU_KAPPA = 0.044715;

/** gelu_tanh(gate) * up for gu = [gate | up] (Gemma's GeGLU), with the same hand-written-gradient discipline. */
export function geGlu(gu: tf.Tensor2D): tf.Tensor2D {
  if (fusedLayersFor(gu)) return fusedGluOp(gu, "gelu");
  const inner = (g: tf.Tensor) => tf.tanh(tf.mul(k(GELU_BETA), tf.add(g, tf.mul(k(GELU_KAPPA), tf.mul(g, tf.square(g))))));
  const op = tf.customGrad((...args: GradArgs) => {
    const [x, save] = args as [tf.Tensor2D, tf.GradSaveFunc];
    save([x]);
    return {
      // 0.5 g (1 + tanh(beta (g + kappa g^3))) * up
      value: tf.tidy(() => { const [g, u] = tf.split(x, 2, 1); return tf.mul(tf.mul(tf.mul(k(0.5), g!), tf.add(k(1), inner(g!))), u!); }),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const [g, u] = tf.split(saved[0]!, 2, 1), t = inner(g!), d = dy as tf.Tensor;
        const gelu = tf.mul(tf.mul(k(0.5), g!), tf.add(k(1), t));
        // d gelu/dg = 0.5 (1 + t) + 0.5 g (1 - t^2) beta (1 + 3 kappa g^2)
        const dGelu = tf.add(tf.mul(k(0.5), tf.add(k(1), t)),
          tf.mul(tf.mul(tf.mul(k(0.5), g!), tf.sub(k(1), tf.square(t))), tf.mul(k(GELU_BETA), tf.add(k(1), tf.mul(k(3 * GELU_KAPPA), tf.square(g!))))));
        return [tf.concat([tf.mul(tf.mul(d, u!), dGelu), tf.mul(d, gelu)], 1)];
      }),
    };
  });
  return op(gu) as tf.Tensor2D;
}

/** cap * tanh(x / cap): Gemma's soft-capping of attention scores and logits. */
export function softcap(x: tf.Tensor, cap: number): tf.Tensor {
  return tf.mul(tf.tanh(tf.div(x, cap)), cap);
}
