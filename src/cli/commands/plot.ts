// `verl plot METRICS.jsonl [--out DIR]`: the curves of a run from the `file`
// logger's JSONL, one SVG per chart (reward, KL, response length, validation
// accuracy, losses, learning rate), each drawn only when its metrics are present.
// Prints the paths it wrote. Default DIR: `plots/` beside the metrics file.
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { writeFileAtomic } from "../../utils/fs.js";
import { lineChartSvg, seriesFromJsonl, type Series } from "../../utils/svg_plot.js";
import { CliError, type CommandContext } from "../context.js";

export interface ChartSpec {
  /** File name without .svg. */
  file: string;
  title: string;
  yLabel: string;
  /** Metric keys drawn on this chart, when present (a RegExp takes every key it matches, in sorted order). */
  keys: (string | RegExp)[];
}

export const CHARTS: readonly ChartSpec[] = [
  { file: "reward", title: "Reward", yLabel: "mean per sequence", keys: ["critic/score/mean", "critic/rewards/mean"] },
  { file: "kl", title: "KL to the reference / old policy", yLabel: "KL", keys: ["actor/kl_loss", "actor/ppo_kl", "critic/kl"] },
  { file: "response_length", title: "Response length", yLabel: "tokens", keys: ["response_length/mean", "response_length/max"] },
  { file: "val_accuracy", title: "Validation accuracy", yLabel: "mean reward", keys: [/^val-core\//] },
  { file: "loss", title: "Loss", yLabel: "loss", keys: ["train/loss", "val/loss", "actor/pg_loss", "critic/vf_loss"] },
  { file: "entropy", title: "Policy entropy", yLabel: "nats per token", keys: ["actor/entropy"] },
  { file: "lr", title: "Learning rate", yLabel: "lr", keys: ["train/lr", "train/lr(1e-3)", "actor/lr"] },
];

/** The series of one chart that the metrics hold. */
export function chartSeries(spec: ChartSpec, byKey: Map<string, Array<[number, number]>>): Series[] {
  const names: string[] = [];
  for (const k of spec.keys) {
    if (typeof k === "string") { if (byKey.has(k)) names.push(k); }
    else names.push(...[...byKey.keys()].filter((n) => k.test(n)).sort());
  }
  return [...new Set(names)].map((name) => ({ name, points: byKey.get(name)! }));
}

/** Write every chart with data into `outDir`; returns the paths written. */
export function plotMetrics(metricsPath: string, outDir: string): string[] {
  if (!existsSync(metricsPath)) throw new CliError(`${metricsPath}: no such file`);
  const byKey = seriesFromJsonl(readFileSync(metricsPath, "utf8"), metricsPath);
  const written: string[] = [];
  for (const spec of CHARTS) {
    const series = chartSeries(spec, byKey);
    if (series.length === 0) continue;
    const path = join(outDir, `${spec.file}.svg`);
    // One series draws no legend, so its metric name goes into the title.
    const title = series.length === 1 ? `${spec.title}: ${series[0]!.name}` : spec.title;
    writeFileAtomic(path, lineChartSvg(series, { title, xLabel: "step", yLabel: spec.yLabel }) + "\n");
    written.push(path);
  }
  if (written.length === 0) {
    const found = [...byKey.keys()].sort().slice(0, 20).join(", ") || "none";
    throw new CliError(`${metricsPath}: none of the plotted metrics are present (numeric keys found: ${found})`);
  }
  return written;
}

export async function run(ctx: CommandContext): Promise<void> {
  const metrics = ctx.options.metrics;
  if (typeof metrics !== "string" || metrics === "") throw new CliError("verl plot: give the metrics JSONL file");
  const path = resolve(metrics);
  const out = typeof ctx.options.out === "string" && ctx.options.out !== "" ? resolve(ctx.options.out) : join(dirname(path), "plots");
  try {
    for (const p of plotMetrics(path, out)) process.stdout.write(`${p}\n`);
  } catch (e) {
    if (e instanceof CliError) throw e;
    throw new CliError((e as Error).message);
  }
}
