// Loss metrics are scalar tensors made inside the gradient tape, where tf.tidy would
// free them. Keep them there, read them after the step:
//   let kept: LossMetrics = {};
//   const { grads } = tf.variableGrads(() => { const out = lossFn(args); kept = keepMetrics(out.metrics); return out.pgLoss; });
//   const metrics = await readMetrics(kept);   // plain numbers; the tensors are disposed
import * as tf from "@tensorflow/tfjs";
import type { LossMetrics } from "./types.js";

export function keepMetrics(metrics: LossMetrics): LossMetrics {
  for (const v of Object.values(metrics)) if (typeof v !== "number") tf.keep(v);
  return metrics;
}

export async function readMetrics(metrics: LossMetrics): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(metrics)) {
    if (typeof v === "number") out[k] = v;
    else {
      out[k] = (await v.data())[0]!;
      v.dispose();
    }
  }
  return out;
}
