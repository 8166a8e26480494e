// Stage timers for the fit loop (verl's marked_timer): seconds per named stage,
// added up when a stage runs more than once in a step.
import { performance } from "node:perf_hooks";

export type TimingRaw = Record<string, number>;

export async function timed<T>(timing: TimingRaw, name: string, fn: () => Promise<T> | T): Promise<T> {
  const t0 = performance.now();
  try {
    return await fn();
  } finally {
    timing[name] = (timing[name] ?? 0) + (performance.now() - t0) / 1000;
  }
}
