// Qwen3-MoE's router auxiliary (load-balancing) loss, as transformers' load_balancing_loss_func
// computes it: over the router logits of every sparse layer (concatenated), with p = softmax of
// the logits over all experts and s = 1 on each token's top-k experts,
//   aux = numExperts * sum_e (mean over real tokens of s[:, e]) * (mean over real tokens of p[:, e])
// (1 when routing is uniform). The training loss adds router_aux_loss_coef * aux. Also the
// routing's load: the busiest expert's share of the routed slots, times numExperts (1 = balanced).
import * as tf from "@tensorflow/tfjs";

/** 1 at each row's k largest entries, else 0; no gradient (the selection is a constant of the step). */
export function topKMask(p: tf.Tensor, k: number): tf.Tensor {
  const op = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const x = args[0] as tf.Tensor;
    const E = x.shape[x.shape.length - 1]!;
    return {
      value: tf.tidy(() => tf.oneHot(tf.topk(x, k).indices, E).sum(-2).toFloat()),
      gradFunc: (dy: tf.Tensor | tf.Tensor[]) => [tf.zerosLike(dy as tf.Tensor)],
    };
  });
  return op(p) as tf.Tensor;
}

/**
 * The aux loss and the load of router logits `layers` (each [N, E], the same N tokens), with
 * `tokenMask` [N] (1 real, 0 padding; all real when absent).
 */
export function routerLoss(layers: tf.Tensor[], topK: number, tokenMask?: ArrayLike<number>): { aux: tf.Scalar; load: tf.Scalar } {
  if (layers.length === 0) throw new Error("routerLoss: no router logits (the model has no sparse layer)");
  return tf.tidy(() => {
    const N = layers[0]!.shape[0]!, E = layers[0]!.shape[1]!;
    const logits = layers.length === 1 ? layers[0]! : tf.concat(layers, 0); // [L*N, E]
    const p = tf.softmax(logits), s = topKMask(p, topK);
    const m = tokenMask ? tf.tile(tf.tensor2d(Float32Array.from(tokenMask), [N, 1]), [layers.length, 1]) : tf.onesLike(logits.slice([0, 0], [-1, 1]));
    const count = m.sum();
    const tokensPerExpert = s.mul(m).sum(0).div(count), probPerExpert = p.mul(m).sum(0).div(count);
    const aux = tokensPerExpert.mul(probPerExpert).sum().mul(E) as tf.Scalar;
    const load = tokensPerExpert.max().mul(E / topK) as tf.Scalar;
    return { aux, load };
  });
}
