// Guards against a run that goes on without learning: non-finite rewards are
// counted (reward/non_finite_count) and warned about, and optimizer steps skipped
// for a non-finite gradient norm end the run once trainer.max_consecutive_skipped_steps
// of them come in a row (each role counted on its own).
import type { TensorData } from "../../protocol/tensor.js";
import { logger } from "../../utils/logger.js";

/** How many entries of a reward tensor are NaN or infinite. */
export function countNonFinite(t: TensorData): number {
  let bad = 0;
  for (let i = 0; i < t.data.length; i++) if (!Number.isFinite(t.data[i]!)) bad++;
  return bad;
}

/** reward/non_finite_count for the step; warns (naming a few rows) when it is not 0. */
export function nonFiniteRewardMetrics(rewards: TensorData, dataSources: unknown[] | undefined, step: number): Record<string, number> {
  const count = countNonFinite(rewards);
  if (count > 0) {
    const width = rewards.shape[1] ?? 1;
    const rows: number[] = [];
    for (let i = 0; i < rewards.data.length && rows.length < 5; i++) {
      const row = Math.floor(i / width);
      if (!Number.isFinite(rewards.data[i]!) && !rows.includes(row)) rows.push(row);
    }
    logger().warn(
      { step, count, rows, data_sources: [...new Set(rows.map((r) => dataSources?.[r]))] },
      "non-finite rewards (NaN or Infinity) from the reward function: the policy cannot learn from them (their optimizer steps are skipped)",
    );
  }
  return { "reward/non_finite_count": count };
}

/** A worker's per-optimizer-step list from meta_info.metrics (collected per rank: rank 0's list, as every rank holds the same global norm). */
export function perOptimizerStep(metrics: unknown, key: string): number[] {
  const v = (metrics as Record<string, unknown> | undefined)?.[key];
  if (!Array.isArray(v)) return typeof v === "number" ? [v] : [];
  const first = Array.isArray(v[0]) ? (v[0] as unknown[]) : v;
  return first.filter((x): x is number => typeof x === "number");
}

export class SkippedStepGuard {
  private readonly inARow = new Map<string, number>();

  /** `limit`: null = never fail. */
  constructor(private readonly limit: number | null) {
    if (limit !== null && (!Number.isInteger(limit) || limit < 1)) {
      throw new Error(`trainer.max_consecutive_skipped_steps must be a positive integer or null, got ${limit}`);
    }
  }

  /** Feeds one training step's grad norms of `role` (actor, critic); throws when the limit is reached. */
  observe(role: string, gradNorms: number[], step: number): void {
    for (const norm of gradNorms) {
      if (Number.isFinite(norm)) {
        this.inARow.set(role, 0);
        continue;
      }
      const n = (this.inARow.get(role) ?? 0) + 1;
      this.inARow.set(role, n);
      logger().warn({ step, role, gradNorm: norm, inARow: n }, "optimizer step skipped: the gradient norm is not finite");
      if (this.limit !== null && n >= this.limit) {
        throw new Error(
          `the ${role} skipped ${n} optimizer steps in a row (non-finite grad norm) at step ${step}: training is not learning ` +
            "(check reward/non_finite_count and the reward function, the learning rate, and the loaded weights); " +
            `stopping (trainer.max_consecutive_skipped_steps=${this.limit})`,
        );
      }
    }
  }
}
