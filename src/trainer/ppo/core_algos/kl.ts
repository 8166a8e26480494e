// KL estimators between the policy and the reference (verl kl_penalty, §4.4) and the
// controllers of the in-reward KL coefficient.
import * as tf from "@tensorflow/tfjs";
import { FUSED_KL_KINDS, fusedKlPenalty, fusedLossFor, type FusedKlKind } from "../../../engine/webgpu_fused_ppo.js";
import type { KlCtrlConfig } from "./types.js";
import { stopGradient } from "./functional.js";

export const KL_PENALTY_KINDS = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] as const;

function unknownKind(kind: string): Error {
  if (kind === "full" || kind === "full+") {
    return new Error("kl_penalty 'full' needs the whole vocabulary distribution and is not implemented (as in verl); use k1/k2/k3");
  }
  const known = [...KL_PENALTY_KINDS, ...KL_PENALTY_KINDS.map((k) => `${k}+`)];
  return new Error(`unknown kl_penalty '${kind}'; choose one of ${known.join(", ")}`);
}

/** The forward value of a KL estimator (no straight-through handling). */
export function klPenaltyForward(logProb: tf.Tensor, refLogProb: tf.Tensor, kind: string): tf.Tensor {
  return tf.tidy(() => {
    switch (kind) {
      case "kl":
      case "k1":
        return tf.sub(logProb, refLogProb);
      case "abs":
        return tf.abs(tf.sub(logProb, refLogProb));
      case "mse":
      case "k2":
        return tf.mul(0.5, tf.square(tf.sub(logProb, refLogProb)));
      case "low_var_kl":
      case "k3": {
        // Schulman's k3 on log(ref/π), clamped for stability.
        const k = tf.clipByValue(tf.sub(refLogProb, logProb), -20, 20);
        return tf.clipByValue(tf.sub(tf.sub(tf.exp(k), k), 1), -10, 10);
      }
      default:
        throw unknownKind(kind);
    }
  });
}

/**
 * KL estimate per token. A trailing "+" (e.g. "k3+") keeps the value of the named
 * estimator but takes the gradient of k2, whose expected gradient is the true KL's.
 */
export function klPenalty(logProb: tf.Tensor, refLogProb: tf.Tensor, kind: string): tf.Tensor {
  // WebGPU: one kernel forward, one backward (the same formulas and gradient rules)
  if ((FUSED_KL_KINDS as readonly string[]).includes(kind) && fusedLossFor(logProb, refLogProb)) return fusedKlPenalty(logProb, refLogProb, kind as FusedKlKind);
  const straightThrough = kind.endsWith("+");
  const base = straightThrough ? kind.slice(0, -1) : kind;
  if (!straightThrough || base === "mse" || base === "k2") return klPenaltyForward(logProb, refLogProb, base);
  return tf.tidy(() => {
    const forward = klPenaltyForward(logProb, refLogProb, base);
    const k2 = klPenaltyForward(logProb, refLogProb, "k2");
    return tf.add(k2, stopGradient(tf.sub(forward, k2)));
  });
}

export interface KlController {
  value: number;
  update(currentKl: number, nSteps: number): void;
}

export class FixedKLController implements KlController {
  constructor(public value: number) {}
  update(_currentKl: number, _nSteps: number): void {}
}

/** Ziegler et al. (2019): value ·= 1 + clip(kl/target − 1, ±0.2)·nSteps/horizon. */
export class AdaptiveKLController implements KlController {
  constructor(public value: number, readonly target: number, readonly horizon: number) {
    if (!(horizon > 0)) throw new Error(`algorithm.kl_ctrl.horizon must be larger than 0, got ${horizon}`);
  }
  update(currentKl: number, nSteps: number): void {
    const err = Math.min(Math.max(currentKl / this.target - 1, -0.2), 0.2);
    this.value *= 1 + (err * nSteps) / this.horizon;
  }
}

/** Build the controller named by `algorithm.kl_ctrl.type` (fixed | adaptive). */
export function getKlController(klCtrl: KlCtrlConfig): KlController {
  const coef = klCtrl.kl_coef ?? 0.001;
  if (typeof coef !== "number") throw new Error(`algorithm.kl_ctrl.kl_coef must be a number, got ${String(coef)}`);
  const type = klCtrl.type ?? "fixed";
  if (type === "fixed") return new FixedKLController(coef);
  if (type === "adaptive") return new AdaptiveKLController(coef, klCtrl.target_kl ?? 0.1, klCtrl.horizon ?? 10000);
  throw new Error(`unknown algorithm.kl_ctrl.type '${type}'; choose fixed or adaptive`);
}
