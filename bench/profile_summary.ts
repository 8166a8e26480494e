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
  /** Time of the project's functions including what they call (selfMs holds the inclusive time here). */
  inclusiveProject: FunctionTime[];
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
const isProject = (f: CallFrame) => area(f) === "verl-ts (js)";
const frameKey = (f: CallFrame) => `${f.functionName}|${f.url}|${f.lineNumber}`;

/**
 * Functions of the tfjs-backend-wasm 4.22 SIMD binary (module wasm://wasm/0019ea4a), identified by
 * profiling one op at a time; other builds number their functions differently.
 */
const TFJS_WASM_422: Record<number, string> = {
  400: "XNNPACK f32 GEMM (MatMul)", 280: "Transpose", 453: "Mul", 433: "Add", 467: "Sub", 439: "RealDiv", 486: "Sigmoid",
  490: "Square", 489: "Neg", 557: "Exp", 207: "Sum", 125: "Max", 135: "Mean",
};

/** What a sample's innermost frame is called in the ranking: wasm functions get a name or their JS caller. */
function label(frame: CallFrame, parent: CallFrame | undefined): string {
  const m = frame.functionName.match(/^\$?wasm-function\[(\d+)\]$/);
  if (!m) return frame.functionName || "(anonymous)";
  if (frame.url.endsWith("/0019ea4a")) {
    const known = TFJS_WASM_422[Number(m[1])];
    if (known) return `${frame.functionName} = tfjs wasm ${known}`;
  }
  return `${frame.functionName} <- ${parent?.functionName || "(anonymous)"}`;
}

interface NodeInfo { frame: CallFrame; parent?: CallFrame; loading: boolean; project: string[] }

/** Per profile node: its frame, its caller, whether the module loader is on its stack, the project functions on its stack. */
function annotate(prof: CpuProfile): Map<number, NodeInfo> {
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const childIds = new Set(prof.nodes.flatMap((n) => n.children ?? []));
  const out = new Map<number, NodeInfo>();
  const walk = (id: number, parent: NodeInfo | undefined) => {
    const n = byId.get(id);
    if (!n) return;
    const f = n.callFrame;
    const project = parent?.project ?? [];
    const info: NodeInfo = {
      frame: f, parent: parent?.frame, loading: (parent?.loading ?? false) || isLoader(f),
      project: isProject(f) && !project.includes(frameKey(f)) ? [...project, frameKey(f)] : project,
    };
    out.set(id, info);
    for (const c of n.children ?? []) walk(c, info);
  };
  for (const n of prof.nodes) if (!childIds.has(n.id)) walk(n.id, undefined);
  return out;
}

export function summarise(files: string[], top = 25): ProfileSummary {
  const self = new Map<string, { fn: string; where: string; us: number }>();
  const inclusive = new Map<string, { fn: string; where: string; us: number }>();
  const byArea: Record<string, number> = {};
  const threads: ThreadTime[] = [];
  let busy = 0, idle = 0, loading = 0;
  const add = (m: typeof self, key: string, fn: string, f: CallFrame, us: number) => {
    const e = m.get(key) ?? { fn, where: `${shortUrl(f.url)}:${f.lineNumber + 1}`, us: 0 };
    e.us += us;
    m.set(key, e);
  };
  for (const file of files) {
    const prof: unknown = JSON.parse(readFileSync(file, "utf8"));
    if (!isProfile(prof)) throw new Error(`profile_summary: ${file} is not a V8 .cpuprofile (no nodes/samples/timeDeltas)`);
    const nodes = annotate(prof);
    const frames = new Map(prof.nodes.map((n) => [frameKey(n.callFrame), n.callFrame]));
    const t = { busy: 0, idle: 0, loading: 0 };
    prof.samples.forEach((id, i) => {
      const info = nodes.get(id);
      if (!info) throw new Error(`profile_summary: ${file}: sample ${i} names node ${id}, which the profile lacks`);
      // The interval after a sample belongs to it (the last sample has none).
      const us = prof.timeDeltas[i + 1] ?? 0;
      const frame = info.frame;
      if (frame.functionName === "(idle)") { t.idle += us; return; }
      if (info.loading) { t.loading += us; return; }
      t.busy += us;
      const name = label(frame, info.parent);
      add(self, `${frameKey(frame)}|${name}`, name, frame, us);
      for (const key of info.project) add(inclusive, key, frames.get(key)!.functionName || "(anonymous)", frames.get(key)!, us);
      const a = area(frame);
      byArea[a] = (byArea[a] ?? 0) + us;
    });
    busy += t.busy; idle += t.idle; loading += t.loading;
    threads.push({ file: basename(file), busyMs: t.busy / 1000, idleMs: t.idle / 1000, loadingMs: t.loading / 1000 });
  }
  const ms = (us: number) => Number((us / 1000).toFixed(1));
  const pct = (us: number) => Number(((100 * us) / Math.max(busy, 1)).toFixed(1));
  const ranked = (m: typeof self) => [...m.values()].sort((a, b) => b.us - a.us).slice(0, top).map((e) => ({ fn: e.fn, where: e.where, selfMs: ms(e.us), pct: pct(e.us) }));
  return {
    files: files.length,
    busyMs: ms(busy),
    idleMs: ms(idle),
    loadingMs: ms(loading),
    threads: threads.map((t) => ({ file: t.file, busyMs: ms(t.busyMs * 1000), idleMs: ms(t.idleMs * 1000), loadingMs: ms(t.loadingMs * 1000) })),
    top: ranked(self),
    inclusiveProject: ranked(inclusive),
    byArea: Object.fromEntries(Object.entries(byArea).sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, pct(v)])),
  };
}

export function formatSummary(s: ProfileSummary, title: string): string {
  const lines = [`${title}: ${s.files} profile(s) (one per thread), busy ${s.busyMs} ms, idle ${s.idleMs} ms, module loading ${s.loadingMs} ms (left out)`];
  for (const t of s.threads) lines.push(`  thread ${t.file}: busy ${t.busyMs} ms, idle ${t.idleMs} ms, loading ${t.loadingMs} ms`);
  lines.push(`  by area (% of busy): ${Object.entries(s.byArea).map(([k, v]) => `${k} ${v}%`).join(", ")}`);
  lines.push("  self ms   %     function  (script:line)");
  for (const f of s.top) lines.push(`  ${String(f.selfMs).padStart(8)} ${String(f.pct).padStart(5)}  ${f.fn}  (${f.where})`);
  lines.push("  inclusive ms  %   verl-ts function (with what it calls)  (script:line)");
  for (const f of s.inclusiveProject) lines.push(`  ${String(f.selfMs).padStart(8)} ${String(f.pct).padStart(5)}  ${f.fn}  (${f.where})`);
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
