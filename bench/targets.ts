// The performance targets, checked against the suite's result lines, and the
// human-readable table run-all prints at the end.
import type { Stats } from "./common.js";

/** One line of the results file (a benchmark's result, a skip, an error, or the targets). */
export type ResultLine = { name: string; [key: string]: unknown };

export interface TargetCheck {
  target: string;
  value: number | boolean | null;
  met: boolean | null;
  note?: string;
}

const ROLLOUT_TOKENS_PER_S = 20_000;
const SCALING = 1.7;
const VS_PYTORCH = 1.5;
const RSS_GROWTH_PCT = 5;
/**
 * Cross-host all-reduce over raw duplex TCP on the same link, measured in the same run (issue 26).
 * 2026-12-04, two namespaces, five runs, load 2.8-4.6: 16 MiB median 1.02 (0.89-1.12), 256 MiB
 * 0.80 (0.79-0.86), reducing in place in the bridge memory (docs/distributed.md, "Figures").
 */
const OF_RAW_TCP = 0.7;

/** figures.<a>.<b>... of the named line, or undefined. */
function figure(results: ResultLine[], name: string, ...path: string[]): unknown {
  let v: unknown = results.find((r) => r.name === name)?.figures;
  for (const p of path) v = v && typeof v === "object" ? (v as Record<string, unknown>)[p] : undefined;
  return v;
}

const median = (v: unknown): number | null => (v && typeof v === "object" && typeof (v as Stats).median === "number" ? (v as Stats).median : null);
const num = (v: unknown): number | null => (typeof v === "number" ? v : null);

function check(target: string, value: number | boolean | null, ok: (v: number | boolean) => boolean, note?: string): TargetCheck {
  return { target, value, met: value === null ? null : ok(value), ...(value === null ? { note: note ?? "not measured in this run" } : note ? { note } : {}) };
}

export function checkTargets(results: ResultLine[], pytorch?: ResultLine): ResultLine {
  const checks: TargetCheck[] = [
    check(`rollout, 2 ranks >= ${ROLLOUT_TOKENS_PER_S} generated tokens/s`, median(figure(results, "rollout", "ranks_2", "generated_tokens_per_s")), (v) => (v as number) >= ROLLOUT_TOKENS_PER_S),
    check(`rollout scaling 2 ranks / 1 rank >= ${SCALING}`, num(figure(results, "rollout", "scaling_2_over_1")), (v) => (v as number) >= SCALING),
    check(`actor update scaling 2 ranks / 1 rank >= ${SCALING}`, num(figure(results, "actor_update", "scaling_2_over_1")), (v) => (v as number) >= SCALING),
    check("live tensor count identical after the memory steps", (figure(results, "memory", "live_tensors_identical") as boolean | undefined) ?? null, (v) => v === true),
    check(`process RSS growth over the memory steps < ${RSS_GROWTH_PCT}%`, num(figure(results, "memory", "rss_growth_pct")), (v) => (v as number) < RSS_GROWTH_PCT),
  ];
  // Between two network namespaces (a real Linux network device); on loopback where namespaces cannot be made.
  const netns = figure(results, "allreduce_hosts", "hosts_netns_16MiB_of_raw") !== undefined;
  for (const mib of [16, 256]) {
    const where = netns ? "netns" : "loopback";
    checks.push(check(
      `cross-host all-reduce ${mib} MiB >= ${OF_RAW_TCP} of raw TCP on the same link (${where})`,
      num(figure(results, "allreduce_hosts", `hosts_${where}_${mib}MiB_of_raw`)), (v) => (v as number) >= OF_RAW_TCP,
    ));
  }
  for (const w of [1, 2]) {
    const ours = median(figure(results, "actor_update", `ranks_${w}`, "tokens_per_s"));
    const ref = pytorch ? median(figure([pytorch], pytorch.name, `threads_${w}`, "tokens_per_s")) : null;
    const ratio = ours && ref ? Number((ref / ours).toFixed(3)) : null;
    checks.push(check(
      `actor update time <= ${VS_PYTORCH}x PyTorch's (${w} rank(s) vs ${w} thread(s))`, ratio, (v) => (v as number) <= VS_PYTORCH,
      pytorch ? undefined : "no PyTorch figure: set VERL_BENCH_PYTHON to a Python with torch, or pass the JSON line of bench/pytorch_actor_update.py run elsewhere with --pytorch FILE",
    ));
  }
  return { name: "targets", checks, date: new Date().toISOString() };
}

/**
 * How much of its cores a result got: the lowest cpu_utilisation / ranks over its ranks_N (threads_N) figures
 * (1 = every rank had a core all along), or undefined for results without such figures.
 */
export function coreShare(line: ResultLine): number | undefined {
  const f = line.figures as Record<string, { cpu_utilisation?: { median: number } }> | undefined;
  let worst: number | undefined;
  for (const [k, v] of Object.entries(f ?? {})) {
    const ranks = Number(k.match(/^(ranks|threads)_(\d+)$/)?.[2]);
    const util = v?.cpu_utilisation?.median;
    if (ranks > 0 && typeof util === "number") worst = Math.min(worst ?? Infinity, util / ranks);
  }
  return worst;
}

/** Below this share another process held one of the cores for a good part of the run. */
export const CONTENDED = 0.85;

function fmt(v: unknown): string {
  if (typeof v === "number") return Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3);
  const s = v as Stats | undefined;
  if (s && typeof s.median === "number") return `${fmt(s.median)} [${fmt(s.min)}-${fmt(s.max)}]`;
  return String(v);
}

/** Figures left out of the table (counts of work done, settings echoed by other helpers' scripts). */
const HIDDEN = new Set(["tokens", "generated_tokens", "cores", "calls", "allreduce_iters", "threads", "new_tokens", "step"]);

/** The headline figures, one row each: benchmark, figure, median [min-max], load at start/end. */
export function formatTable(results: ResultLine[]): string {
  const rows: string[][] = [["benchmark", "figure", "median [min-max]", "load 1m"]];
  for (const r of results) {
    if (r.name === "targets") continue;
    if (typeof r.skipped === "string" || typeof r.error === "string") {
      rows.push([r.name, typeof r.skipped === "string" ? "skipped" : "ERROR", String(r.skipped ?? r.error), ""]);
      continue;
    }
    const load = (r.machine as { load_avg_1m?: { start: number; end: number } } | undefined)?.load_avg_1m;
    const l = load ? `${load.start}/${load.end}` : "";
    const f = (r.figures ?? {}) as Record<string, unknown>;
    const shown = (v: unknown) => typeof v === "number" || typeof v === "boolean" || (typeof v === "object" && v !== null && "median" in v);
    for (const [k, v] of Object.entries(f)) {
      if (HIDDEN.has(k)) continue;
      if (shown(v)) rows.push([r.name, k, fmt(v), l]);
      else if (v && typeof v === "object" && !Array.isArray(v)) {
        for (const [k2, v2] of Object.entries(v as Record<string, unknown>)) if (shown(v2) && !HIDDEN.has(k2)) rows.push([r.name, `${k}.${k2}`, fmt(v2), l]);
      }
    }
  }
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((row) => (row[c] ?? "").length)));
  const out = rows.map((row) => row.map((cell, c) => cell.padEnd(widths[c]!)).join("  ").trimEnd());
  const targets = results.find((r) => r.name === "targets")?.checks as TargetCheck[] | undefined;
  for (const t of targets ?? []) out.push(`${t.met === null ? "n/a " : t.met ? "MET " : "MISS"}  ${t.target}: ${t.value ?? "-"}${t.note ? ` (${t.note})` : ""}`);
  return out.join("\n");
}
