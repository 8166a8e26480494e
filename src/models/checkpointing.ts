// Gradient checkpointing (verl's model.enable_gradient_checkpointing): a block's
// forward runs without the tape, so none of its activations outlive it; the
// backward pass runs the block again under its own tape and differentiates that.
// Only the block's input, its trainable weights and the shared constants are
// kept: peak memory drops from every layer's activations to one layer's, for
// about one extra forward pass of compute.
import * as tf from "@tensorflow/tfjs";

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/** The engine's tape slot (tfjs keeps one active tape; a nested gradient would clear it). */
interface EngineTapeState { state: { activeTape: unknown } }

/**
 * Run tf.grads inside a gradient function. tfjs's engine starts a fresh tape and
 * clears it afterwards when no outer gradient is being recorded, which is the case
 * during the outer backward pass; the outer tape must survive (its saved tensors
 * are released from it when the outer pass ends), so it is put back.
 */
function nestedGrads(f: (...xs: tf.Tensor[]) => tf.Tensor, xs: tf.Tensor[], dy: tf.Tensor): tf.Tensor[] {
  const engine = tf.engine() as unknown as EngineTapeState;
  const outer = engine.state.activeTape;
  try {
    return tf.grads(f)(xs, dy);
  } finally {
    engine.state.activeTape = outer;
  }
}

/**
 * `fn(x, params, consts)`, differentiable in x and params, recomputed in the
 * backward pass. `consts` are tensors fn reads but never differentiates
 * (rotary tables, masks); fn must build everything else from its arguments.
 */
export function checkpoint(
  fn: (x: tf.Tensor, params: tf.Tensor[], consts: tf.Tensor[]) => tf.Tensor,
  x: tf.Tensor, params: tf.Tensor[], consts: tf.Tensor[],
): tf.Tensor {
  const n = 1 + params.length;
  const op = tf.customGrad((...args: GradArgs) => {
    const ins = args.slice(0, n) as tf.Tensor[], save = args[n] as tf.GradSaveFunc;
    save([...ins, ...consts]);
    return {
      // no tape inside a custom op's forward: the layer's intermediates die with this tidy
      value: tf.tidy(() => fn(ins[0]!, ins.slice(1), consts)),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
        const inputs = saved.slice(0, n), cs = saved.slice(n);
        return nestedGrads((...a) => fn(a[0]!, a.slice(1), cs), inputs, dy as tf.Tensor);
      },
    };
  });
  return op(x, ...params) as tf.Tensor;
}
