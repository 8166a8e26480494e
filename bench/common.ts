// What every benchmark of the suite shares: its command-line flags, repetition
// timing with median/min/max, the machine description, the one JSON line it
// prints, and the stories260K config the worker benchmarks start from.
import os from "node:os";
import { loadConfig, type Config } from "../src/config/index.js";
import { sharedPath } from "../src/utils/paths.js";

export const STORIES_BIN = ["models", "stories260K", "stories260K.bin"] as const;

/** The story openings of the stories recipe (recipes/stories_grpo/run.sh): the prompts. */
export const OPENINGS = [
  "Once upon a time", "One day", "Once upon a time, there was a little girl", "Once upon a time, there was a boy",
  "One day, a little", "Tom and Lily", "There was a big", "Once there was a", "Lily wanted to", "Tim was",
  "The sun was shining", "It was a rainy day", "Mom said", "Sue had a", "Ben and his mom", "In a small house",
];

/** Median, min and max of a sample (the figure every benchmark reports). */
export interface Stats {
  median: number;
  min: number;
  max: number;
  n: number;
}

export function stats(xs: number[], digits = 3): Stats {
  if (xs.length === 0) throw new Error("stats: no samples");
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
  const round = (v: number) => Number(v.toPrecision(digits + 3));
  return { median: round(mid), min: round(s[0]!), max: round(s[s.length - 1]!), n: s.length };
}

export interface BenchArgs {
  /** Timed repetitions after the warm-up. */
  reps: number;
  warmup: number;
  /** Free-form numeric flags a benchmark reads (--steps, --micro ...). */
  extra: Map<string, string>;
}

/** `--reps N --warmup N --key value ...` (also `--key=value`). */
export function parseBenchArgs(argv: string[] = process.argv.slice(2), defaults: { reps: number; warmup?: number } = { reps: 5 }): BenchArgs {
  const extra = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith("--")) throw new Error(`benchmark: unexpected argument '${a}' (flags are --name value)`);
    const eq = a.indexOf("=");
    if (eq > 0) extra.set(a.slice(2, eq), a.slice(eq + 1));
    else {
      const v = argv[i + 1];
      if (v === undefined || v.startsWith("--")) throw new Error(`benchmark: flag ${a} needs a value`);
      extra.set(a.slice(2), v);
      i++;
    }
  }
  const int = (key: string, fallback: number, min: number) => {
    const raw = extra.get(key);
    extra.delete(key);
    const v = raw === undefined ? fallback : Number(raw);
    if (!Number.isInteger(v) || v < min) throw new Error(`benchmark: --${key} must be an integer >= ${min}, got '${raw}'`);
    return v;
  };
  return { reps: int("reps", defaults.reps, 1), warmup: int("warmup", defaults.warmup ?? 1, 0), extra };
}

export function intFlag(args: BenchArgs, key: string, fallback: number): number {
  const raw = args.extra.get(key);
  const v = raw === undefined ? fallback : Number(raw);
  if (!Number.isInteger(v) || v < 1) throw new Error(`benchmark: --${key} must be a positive integer, got '${raw}'`);
  return v;
}

/** `--ranks 1,2`: the world sizes a benchmark runs (default 1 and 2). */
export function rankList(raw: string | undefined): number[] {
  const list = (raw ?? "1,2").split(",").map(Number);
  if (list.some((n) => !Number.isInteger(n) || n < 1)) throw new Error(`benchmark: --ranks must be a comma list of positive integers, got '${raw}'`);
  return list;
}

/** One timed repetition: wall seconds, CPU seconds of the whole process (all rank threads), work done. */
export interface Rep {
  seconds: number;
  cpuSeconds: number;
  work: number;
}

/** Runs `fn` warmup times untimed, then reps times timed. `fn` returns the work units it did (tokens). */
export async function repeat(args: BenchArgs, fn: () => Promise<number>): Promise<Rep[]> {
  for (let i = 0; i < args.warmup; i++) await fn();
  const reps: Rep[] = [];
  for (let i = 0; i < args.reps; i++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const work = await fn();
    const seconds = (performance.now() - t0) / 1000;
    const c = process.cpuUsage(c0);
    reps.push({ seconds, cpuSeconds: (c.user + c.system) / 1e6, work });
  }
  return reps;
}

/** Throughput figures of a set of repetitions: work per second (median/min/max over reps) and seconds per rep. */
export function rateFigures(reps: Rep[], unit: string): Record<string, Stats | number> {
  return {
    [`${unit}_per_s`]: stats(reps.map((r) => r.work / r.seconds)),
    seconds: stats(reps.map((r) => r.seconds)),
    // Work per CPU-second of the whole process (driver + ranks): what contention for cores does not change.
    [`${unit}_per_cpu_s`]: stats(reps.map((r) => r.work / r.cpuSeconds)),
    // CPU seconds per wall second: ~ranks when the ranks keep their cores busy.
    cpu_utilisation: stats(reps.map((r) => r.cpuSeconds / r.seconds)),
    [unit]: reps[0]!.work,
  };
}

/**
 * The 2-rank over 1-rank speed-up of `<unit>_per_s`, and the same from work per CPU-second
 * (x2): the speed-up two free cores would give, an estimate where other processes share the
 * cores (it counts a rank spinning in a collective as work, so it errs low).
 */
export function addScaling(figures: Record<string, unknown>, unit: string): void {
  const get = (w: number, k: string) => ((figures[`ranks_${w}`] as Record<string, Stats> | undefined)?.[k])?.median;
  const round = (v: number) => Number(v.toFixed(3));
  const [t1, t2] = [get(1, `${unit}_per_s`), get(2, `${unit}_per_s`)];
  if (t1 && t2) figures.scaling_2_over_1 = round(t2 / t1);
  const [c1, c2] = [get(1, `${unit}_per_cpu_s`), get(2, `${unit}_per_cpu_s`)];
  if (c1 && c2) figures.scaling_2_over_1_cpu_normalised = round((2 * c2) / c1);
}

export function loadAvg1m(): number {
  return Number(os.loadavg()[0]!.toFixed(2));
}

export interface Machine {
  cpu: string;
  cores: number;
  node: string;
  platform: string;
  backend: string;
  load_avg_1m: { start: number; end: number };
}

export function machine(backend: string, loadAtStart: number): Machine {
  return {
    cpu: os.cpus()[0]?.model.trim() ?? "unknown",
    cores: os.availableParallelism(),
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    backend,
    load_avg_1m: { start: loadAtStart, end: loadAvg1m() },
  };
}

export interface BenchResult {
  name: string;
  config: Record<string, unknown>;
  figures: Record<string, unknown>;
  machine: Machine;
}

/** The benchmark's one line on stdout (run-all collects it). */
export function emit(result: BenchResult | { name: string; skipped: string } | { name: string; error: string }): void {
  process.stdout.write(`${JSON.stringify({ ...result, date: new Date().toISOString() })}\n`);
}

/** The stories260K checkpoint, or undefined (the benchmark then prints a skipped line). */
export function storiesPath(): string | undefined {
  return sharedPath(...STORIES_BIN);
}

export const STORIES_ABSENT = "../shared/models/stories260K/stories260K.bin absent";

/**
 * A ppo_trainer config over stories260K for `world` ranks, with the benchmark's sizes
 * as verl overrides (the same composition `verl train` does).
 */
export function storiesConfig(modelPath: string, world: number, overrides: string[]): Config {
  return loadConfig({
    configName: "ppo_trainer",
    overrides: [
      `actor_rollout_ref.model.path=${modelPath}`,
      `trainer.n_gpus_per_node=${world}`,
      "trainer.seed=1",
      // GRPO, as the stories recipe: no critic to configure.
      "algorithm.adv_estimator=grpo",
      ...overrides,
    ],
  });
}

/** Runs a benchmark's main, printing an error line (and exit code 1) when it throws. */
export function runMain(name: string, main: () => Promise<void>): void {
  main().then(
    () => undefined,
    (err: unknown) => {
      process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
      emit({ name, error: err instanceof Error ? err.message : String(err) });
      process.exitCode = 1;
    },
  );
}
