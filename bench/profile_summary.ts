// Top self-time functions of V8 CPU profiles (`node --cpu-prof` writes one
// .cpuprofile per thread: the driver and every rank). Self time of a function =
// the sampling intervals whose innermost frame it was; functions are merged by
// name + script + line across the files given.
// Run: node dist/bench/profile_summary.js <dir-or-.cpuprofile>... [--top 25] [--json]
import { readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { fileURLToPath } from "node:url";

interface CallFrame { functionName: string; url: string; lineNumber: number }
interface ProfileNode { id: number; callFrame: CallFrame; children?: number[] }
interface CpuProfile { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] }

export interface FunctionTime {
  fn: string;
  where: string;
  selfMs: number;
  /** Share of the busy (non-idle) samples of all threads. */
  pct: number;
}

export interface ThreadTime {
  file: string;
  busyMs: number;
  idleMs: number;
  loadingMs: number;
}

export interface ProfileSummary {
  files: number;
  busyMs: number;
  idleMs: number;
  /** Module loading and compiling (startup), left out of the ranking below. */
  loadingMs: number;
  threads: ThreadTime[];
  top: FunctionTime[];
  /** Self time by where the code lives: wasm code, tfjs JS, this project, node internals, GC, other. */
  byArea: Record<string, number>;
}

function isProfile(v: unknown): v is CpuProfile {
  const p = v as CpuProfile;
  return typeof p === "object" && p !== null && Array.isArray(p.nodes) && Array.isArray(p.samples) && Array.isArray(p.timeDeltas);
}

/** Every .cpuprofile under the given files/folders. */
export function profileFiles(paths: string[]): string[] {
  const out: string[] = [];
  for (const p of paths) {
    if (statSync(p).isDirectory()) out.push(...profileFiles(readdirSync(p).map((f) => join(p, f)).filter((f) => statSync(f).isDirectory() || f.endsWith(".cpuprofile"))));
    else out.push(p);
  }
  return out;
}

function area(frame: CallFrame): string {
  const { url, functionName } = frame;
  if (functionName === "(garbage collector)") return "gc";
  if (functionName === "(program)") return "v8 (program)";
  if (url.startsWith("wasm://") || /^\$?wasm-function/.test(functionName)) return "wasm code";
  if (url.includes("@tensorflow")) return "tfjs (js)";
  if (url.includes("/src/") || url.includes("/bench/")) return "verl-ts (js)";
  if (url.startsWith("node:") || url === "") return "node/v8 internals";
  return "other js";
}

function shortUrl(url: string): string {
  const nm = url.lastIndexOf("node_modules/");
  if (nm >= 0) return url.slice(nm + "node_modules/".length);
  const m = url.match(/\/(dist[^/]*\/)?((src|bench)\/.*)$/);
  return m ? m[2]! : url;
}

/** Frames of Node's module loader: samples under them are startup, not the benchmark. */
const isLoader = (f: CallFrame) => f.url.startsWith("node:internal/modules/") || f.functionName === "compileForInternalLoader";

/** Node ids whose stack passes through the module loader. */
function loadingNodes(prof: CpuProfile): Set<number> {
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const childIds = new Set(prof.nodes.flatMap((n) => n.children ?? []));
  const out = new Set<number>();
  const walk = (id: number, inLoader: boolean) => {
    const n = byId.get(id);
    if (!n) return;
    const here = inLoader || isLoader(n.callFrame);
    if (here) out.add(id);
    for (const c of n.children ?? []) walk(c, here);
  };
  for (const n of prof.nodes) if (!childIds.has(n.id)) walk(n.id, false);
  return out;
}

export function summarise(files: string[], top = 25): ProfileSummary {
  const self = new Map<string, { fn: string; where: string; us: number }>();
  const byArea: Record<string, number> = {};
  const threads: ThreadTime[] = [];
  let busy = 0, idle = 0, loading = 0;
  for (const file of files) {
    const prof: unknown = JSON.parse(readFileSync(file, "utf8"));
    if (!isProfile(prof)) throw new Error(`profile_summary: ${file} is not a V8 .cpuprofile (no nodes/samples/timeDeltas)`);
    const nodes = new Map(prof.nodes.map((n) => [n.id, n.callFrame]));
    const loaders = loadingNodes(prof);
    const t = { busy: 0, idle: 0, loading: 0 };
    prof.samples.forEach((id, i) => {
      const frame = nodes.get(id);
      if (!frame) throw new Error(`profile_summary: ${file}: sample ${i} names node ${id}, which the profile lacks`);
      // The interval after a sample belongs to it (the last sample has none).
      const us = prof.timeDeltas[i + 1] ?? 0;
      if (frame.functionName === "(idle)") { t.idle += us; return; }
      if (loaders.has(id)) { t.loading += us; return; }
      t.busy += us;
      const key = `${frame.functionName}|${frame.url}|${frame.lineNumber}`;
      const e = self.get(key) ?? { fn: frame.functionName || "(anonymous)", where: `${shortUrl(frame.url)}:${frame.lineNumber + 1}`, us: 0 };
      e.us += us;
      self.set(key, e);
      const a = area(frame);
      byArea[a] = (byArea[a] ?? 0) + us;
    });
    busy += t.busy; idle += t.idle; loading += t.loading;
    threads.push({ file: basename(file), busyMs: t.busy / 1000, idleMs: t.idle / 1000, loadingMs: t.loading / 1000 });
  }
  const ms = (us: number) => Number((us / 1000).toFixed(1));
  const pct = (us: number) => Number(((100 * us) / Math.max(busy, 1)).toFixed(1));
  return {
    files: files.length,
    busyMs: ms(busy),
    idleMs: ms(idle),
    loadingMs: ms(loading),
    threads: threads.map((t) => ({ file: t.file, busyMs: ms(t.busyMs * 1000), idleMs: ms(t.idleMs * 1000), loadingMs: ms(t.loadingMs * 1000) })),
    top: [...self.values()].sort((a, b) => b.us - a.us).slice(0, top).map((e) => ({ fn: e.fn, where: e.where, selfMs: ms(e.us), pct: pct(e.us) })),
    byArea: Object.fromEntries(Object.entries(byArea).sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, pct(v)])),
  };
}

export function formatSummary(s: ProfileSummary, title: string): string {
  const lines = [`${title}: ${s.files} profile(s) (one per thread), busy ${s.busyMs} ms, idle ${s.idleMs} ms, module loading ${s.loadingMs} ms (left out)`];
  for (const t of s.threads) lines.push(`  thread ${t.file}: busy ${t.busyMs} ms, idle ${t.idleMs} ms, loading ${t.loadingMs} ms`);
  lines.push(`  by area (% of busy): ${Object.entries(s.byArea).map(([k, v]) => `${k} ${v}%`).join(", ")}`);
  lines.push("  self ms   %     function  (script:line)");
  for (const f of s.top) lines.push(`  ${String(f.selfMs).padStart(8)} ${String(f.pct).padStart(5)}  ${f.fn}  (${f.where})`);
  return lines.join("\n");
}

function main(argv: string[]): void {
  let top = 25, json = false;
  const paths: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--top") top = Number(argv[++i]);
    else if (a === "--json") json = true;
    else paths.push(a);
  }
  if (!Number.isInteger(top) || top < 1) throw new Error("profile_summary: --top must be a positive integer");
  const files = profileFiles(paths);
  if (files.length === 0) throw new Error(`profile_summary: no .cpuprofile files under ${paths.join(", ") || "(no paths given)"}`);
  const s = summarise(files, top);
  process.stdout.write(json ? `${JSON.stringify(s)}\n` : `${formatSummary(s, paths.map((p) => basename(p)).join(", "))}\n`);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) main(process.argv.slice(2));
