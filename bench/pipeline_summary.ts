// Groups the compute pipelines a run compiled, from the stderr lines VERL_LOG_PIPELINES=1 prints
// (src/engine/backend.ts): how many and the milliseconds spent creating them (a compile blocks the
// host thread), then the groups of shader keys that differ only in numbers, costliest first (a group
// that keeps growing over the steps is a key that follows a changing size), with when each group
// first and last compiled and, for the large or costly groups, their slowest keys.
// Run: node dist/bench/pipeline_summary.js RUN.log [RUN2.log ...]
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const LINE = /pipeline \d+ at ([\d.]+) s \((\d+) ms\): (\S+)/;

interface Compile { atS: number; ms: number; key: string }

/** The log's compiles grouped by their key with every number replaced by '#', costliest group first. */
export function groupPipelines(log: string): { name: string; compiles: Compile[]; ms: number }[] {
  const groups = new Map<string, Compile[]>();
  for (const line of log.split("\n")) {
    const m = LINE.exec(line);
    if (!m) continue;
    const name = m[3]!.replace(/\d+/g, "#").slice(0, 60);
    groups.set(name, [...(groups.get(name) ?? []), { atS: Number(m[1]), ms: Number(m[2]), key: m[3]! }]);
  }
  return [...groups].map(([name, compiles]) => ({ name, compiles, ms: compiles.reduce((s, c) => s + c.ms, 0) })).sort((a, b) => b.ms - a.ms);
}

function main(paths: string[]): void {
  if (paths.length === 0) throw new Error("pipeline_summary: give one or more logs of a run with VERL_LOG_PIPELINES=1");
  for (const path of paths) {
    const groups = groupPipelines(readFileSync(path, "utf8"));
    const n = groups.reduce((s, g) => s + g.compiles.length, 0), ms = groups.reduce((s, g) => s + g.ms, 0);
    const lines = [`${path}: ${n} pipelines, ${ms} ms compiling`];
    for (const g of groups.slice(0, 25)) {
      const c = g.compiles;
      lines.push(`  ${String(c.length).padStart(4)} x, ${String(g.ms).padStart(6)} ms  first ${c[0]!.atS.toFixed(1)} s  last ${c[c.length - 1]!.atS.toFixed(1)} s  ${g.name}`);
      if (c.length >= 4 || g.ms > 1000) for (const one of [...c].sort((a, b) => b.ms - a.ms).slice(0, 3)) lines.push(`          ${String(one.ms).padStart(5)} ms  ${one.key.slice(0, 240)}`);
    }
    process.stdout.write(`${lines.join("\n")}\n`);
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) main(process.argv.slice(2));
