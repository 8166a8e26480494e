// `npm run bench`: runs each benchmark in its own Node process (clean memory
// figures, one crash does not end the suite), collects the JSON line each prints,
// writes them all to outputs/bench/results-<date>.jsonl and checks the targets.
//   npm run bench                              # everything (~10 min on 2 cores)
//   npm run bench -- --only rollout,actor_update
//   npm run bench -- --quick                   # fewer repetitions, a smoke run
//   npm run bench -- --profile --only rollout  # node --cpu-prof; top self-time functions
//   npm run bench -- --pytorch outputs/bench/pytorch.json   # compare the actor update
//   npm run bench -- --max-load 1 --wait 300 --retry-contended 2   # on a shared machine: start each
//       benchmark when others are quiet, run again one whose ranks did not get a core each
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { writeFileAtomic } from "../src/utils/fs.js";
import { packageRoot } from "../src/utils/paths.js";
import { loadAvg1m, machine } from "./common.js";
import { formatSummary, profileFiles, summarise } from "./profile_summary.js";
import { checkTargets, CONTENDED, coreShare, formatTable, type ResultLine } from "./targets.js";

interface BenchSpec {
  /** The compiled script beside this file (a .py script: bench/ of the package, run by VERL_BENCH_PYTHON). */
  script: string;
  /** Flags for a full run and for --quick. */
  full: string[];
  quick: string[];
  /** Scripts of other helpers print their own JSON shape: wrap it into the suite's line. */
  wrap?: boolean;
  env?: Record<string, string>;
  timeoutS: number;
}

const BENCHES: Record<string, BenchSpec> = {
  rollout: { script: "rollout.js", full: ["--reps", "11"], quick: ["--reps", "2"], timeoutS: 240 },
  log_prob: { script: "log_prob.js", full: ["--reps", "7"], quick: ["--reps", "2"], timeoutS: 240 },
  actor_update: { script: "actor_update.js", full: ["--reps", "5"], quick: ["--reps", "2"], timeoutS: 400 },
  // The same update in PyTorch, right after ours (same load); skipped where Python has no torch.
  pytorch_actor_update: { script: "pytorch_actor_update.py", full: ["--reps", "5"], quick: ["--reps", "2"], timeoutS: 300 },
  grpo_step: { script: "grpo_step.js", full: ["--reps", "4"], quick: ["--reps", "2"], timeoutS: 400 },
  // ZeRO-1: the optimizer step and its state per rank, 1 rank vs 2 ranks replicated vs sharded, and the stories GRPO step both ways
  zero_optimizer: { script: "zero_optimizer.js", full: ["--reps", "5", "--recipe-reps", "3"], quick: ["--reps", "2", "--numel", "2000000", "--recipe-reps", "1"], timeoutS: 900 },
  memory: { script: "memory.js", full: ["--steps", "100"], quick: ["--steps", "10", "--warmup", "2"], timeoutS: 600 },
  // gradient checkpointing / LoRA / remove-padding: peak memory and step time (one process per case)
  training_memory: {
    script: "training_memory.js", full: ["--reps", "2"], quick: ["--reps", "1", "--layers", "2", "--hidden", "128", "--batch", "2"], timeoutS: 900,
  },
  // LoRA update: kernel dispatches and ms of the per-block LoRA product against the batched one
  lora_update: { script: "lora_update.js", full: ["--reps", "7"], quick: ["--reps", "2", "--layers", "2"], timeoutS: 300 },
  controller: {
    script: "controller.js", full: [], quick: [], wrap: true, timeoutS: 300,
    env: {}, // its own defaults; VERL_BENCH_CALLS etc. pass through the environment
  },
  // The same all-reduce in one process, across two host agents on loopback, and across two network namespaces.
  allreduce_hosts: { script: "allreduce_hosts.js", full: ["--iters", "8"], quick: ["--iters", "3", "--mib", "4"], timeoutS: 600 },
  // llama_cpp vs the host decoder at a tiny shape on CPU (one llama.cpp thread: its default spins on small
  // shared VMs); the 0.5B figure on the GPU comes from scripts/gpu-rollout-bench.sh
  rollout_engines: {
    script: "rollout_engines.js", full: ["--shape", "tiny", "--threads", "1"], quick: ["--shape", "tiny", "--threads", "1", "--new", "16"],
    wrap: true, timeoutS: 300,
  },
  single_thread: {
    script: "generation.js", full: [], quick: [], wrap: true, timeoutS: 300,
    env: { VERL_BENCH_QUICK: "0" },
  },
};

interface Options {
  only: string[];
  quick: boolean;
  profile: boolean;
  out: string | undefined;
  pytorch: string | undefined;
  list: boolean;
  /** Wait before each benchmark until other processes keep fewer than this many threads runnable. */
  maxLoad: number | undefined;
  waitS: number;
  /** Runs again (up to this many times) a benchmark whose ranks did not get a core each. */
  retries: number;
}

function parseOptions(argv: string[]): Options {
  const o: Options = { only: Object.keys(BENCHES), quick: false, profile: false, out: undefined, pytorch: undefined, list: false, maxLoad: undefined, waitS: 600, retries: 0 };
  let skip: string[] = [];
  const names = (v: string | undefined, flag: string) => {
    if (!v) throw new Error(`bench: ${flag} needs a comma list of benchmarks (${Object.keys(BENCHES).join(", ")})`);
    const list = v.split(",").map((s) => s.trim()).filter(Boolean);
    for (const n of list) if (!(n in BENCHES)) throw new Error(`bench: unknown benchmark '${n}' in ${flag}; known: ${Object.keys(BENCHES).join(", ")}`);
    return list;
  };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i]!.includes("=") ? argv[i]!.split(/=(.*)/s, 2) as [string, string] : [argv[i]!, undefined];
    const value = () => inline ?? argv[++i];
    switch (flag) {
      case "--only": o.only = names(value(), "--only"); break;
      case "--skip": skip = names(value(), "--skip"); break;
      case "--quick": o.quick = true; break;
      case "--profile": o.profile = true; break;
      case "--out": o.out = value(); break;
      case "--pytorch": o.pytorch = value(); break;
      case "--list": o.list = true; break;
      case "--max-load": o.maxLoad = positive(value(), flag); break;
      case "--wait": o.waitS = positive(value(), flag); break;
      case "--retry-contended": o.retries = Math.floor(positive(value(), flag)); break;
      default: throw new Error(`bench: unknown option '${argv[i]}' (--only, --skip, --quick, --profile, --out FILE, --pytorch FILE, --max-load N, --wait S, --retry-contended N, --list)`);
    }
  }
  o.only = o.only.filter((n) => !skip.includes(n));
  return o;
}

function positive(v: string | undefined, flag: string): number {
  const n = Number(v);
  if (!(n > 0)) throw new Error(`bench: ${flag} needs a positive number, got '${v}'`);
  return n;
}

/**
 * Threads other processes keep runnable right now: /proc/loadavg's running count, sampled
 * `samples` times a second apart while this process idles (minus itself, reading it).
 * Unlike the 1-minute load average it does not remember the benchmark that just ended.
 */
async function othersRunnable(samples = 5): Promise<number | undefined> {
  if (!existsSync("/proc/loadavg")) return undefined;
  let sum = 0;
  for (let i = 0; i < samples; i++) {
    if (i > 0) await sleep(1000);
    const running = Number(readFileSync("/proc/loadavg", "utf8").split(" ")[3]?.split("/")[0]);
    sum += Math.max(0, running - 1);
  }
  return sum / samples;
}

/** Waits until others keep fewer than `maxLoad` threads runnable, or `waitS` seconds have passed. */
async function waitForQuiet(maxLoad: number, waitS: number): Promise<{ busy?: number; message: string }> {
  const t0 = performance.now();
  for (;;) {
    const busy = await othersRunnable();
    if (busy === undefined) return { message: "no /proc/loadavg: not waiting" };
    const waited = (performance.now() - t0) / 1000;
    if (busy < maxLoad) return { busy, message: `others runnable ${busy.toFixed(1)} after ${waited.toFixed(0)} s` };
    if (waited > waitS) return { busy, message: `others runnable ${busy.toFixed(1)}, still >= ${maxLoad} after ${waited.toFixed(0)} s: running anyway` };
    await sleep(5000);
  }
}

const stamp = () => new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19);

/** Runs one benchmark script; resolves with its JSON lines (or an error line). */
function runBench(name: string, spec: BenchSpec, opts: Options, profileDir: string | undefined): Promise<ResultLine[]> {
  const python = spec.script.endsWith(".py");
  const script = python ? join(packageRoot, "bench", spec.script) : join(fileURLToPath(new URL(".", import.meta.url)), spec.script);
  if (!existsSync(script)) return Promise.resolve([{ name, error: `${script} is missing (build first: npm run build)` }]);
  const flags = opts.quick ? spec.quick : spec.full;
  if (python) {
    const why = torchMissing();
    if (why) return Promise.resolve([{ name, skipped: why }]);
  }
  const nodeArgs = profileDir ? ["--cpu-prof", "--cpu-prof-dir", profileDir] : [];
  const [command, args] = python ? [pythonCommand(), [script, ...flags]] : [process.execPath, [...nodeArgs, script, ...flags]];
  const load0 = loadAvg1m();
  return new Promise((resolve) => {
    const child = spawn(command, args, {
      stdio: ["ignore", "pipe", "inherit"],
      env: { VERL_LOG_LEVEL: "warn", ...process.env, ...(spec.env ?? {}) },
    });
    let stdout = "";
    child.stdout.on("data", (d: Buffer) => { stdout += d.toString("utf8"); });
    const timer = setTimeout(() => child.kill("SIGKILL"), spec.timeoutS * 1000);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      const lines: ResultLine[] = [];
      for (const raw of stdout.split("\n")) {
        if (!raw.startsWith("{")) continue;
        let parsed: Record<string, unknown>;
        try { parsed = JSON.parse(raw) as Record<string, unknown>; } catch { continue; }
        lines.push(spec.wrap ? wrapForeign(name, spec.script, parsed, load0) : (parsed as ResultLine));
      }
      if (lines.length === 0) {
        const why = signal === "SIGKILL" ? `killed after ${spec.timeoutS} s` : `exited with code ${code} and printed no JSON line`;
        lines.push({ name, error: why });
      }
      resolve(lines);
    });
  });
}

const pythonCommand = () => process.env.VERL_BENCH_PYTHON ?? "python3";

/** Why the PyTorch reference cannot run here, or undefined when torch imports. */
function torchMissing(): string | undefined {
  const r = spawnSync(pythonCommand(), ["-c", "import torch"], { encoding: "utf8" });
  if (r.status === 0) return undefined;
  return `PyTorch does not import with '${pythonCommand()}' (${r.error?.message ?? r.stderr.trim().split("\n").pop()}): set VERL_BENCH_PYTHON to a Python that has torch`;
}

/** controller.js / generation.js print their own object: keep it as the figures of a suite line. */
function wrapForeign(name: string, script: string, raw: Record<string, unknown>, load0: number): ResultLine {
  if (typeof raw.skipped === "string") return { name, skipped: raw.skipped };
  const { bench: _bench, backend, load_avg_1m: _load, ...figures } = raw;
  return {
    name,
    config: { script: `bench/${script.replace(/\.js$/, ".ts")}`, note: "written by another helper; run unchanged" },
    figures,
    machine: machine(typeof backend === "string" ? backend : "n/a", load0),
    date: new Date().toISOString(),
  };
}

async function main(): Promise<void> {
  const opts = parseOptions(process.argv.slice(2));
  if (opts.list) {
    process.stdout.write(`${Object.keys(BENCHES).join("\n")}\n`);
    return;
  }
  const runStamp = stamp();
  const outDir = join(packageRoot, "outputs", "bench");
  const outFile = opts.out ?? join(outDir, `results-${runStamp}.jsonl`);
  mkdirSync(outDir, { recursive: true });
  const pytorchFile = opts.pytorch ? (JSON.parse(readFileSync(opts.pytorch, "utf8").trim().split("\n").pop()!) as ResultLine) : undefined;
  const results: ResultLine[] = [];
  const save = () => writeFileAtomic(outFile, results.map((r) => JSON.stringify(r)).join("\n") + "\n");
  const t0 = performance.now();
  for (const name of opts.only) {
    let best: ResultLine[] | undefined;
    const profileDir = opts.profile ? join(outDir, "profiles", runStamp, name) : undefined;
    for (let attempt = 0; attempt <= opts.retries; attempt++) {
      const quiet = opts.maxLoad === undefined ? undefined : await waitForQuiet(opts.maxLoad, opts.waitS);
      process.stderr.write(`bench: ${name}${attempt ? ` (again: ranks did not get a core each)` : ""} (load ${loadAvg1m()}${quiet ? `, ${quiet.message}` : ""}) ...\n`);
      if (profileDir) rmSync(profileDir, { recursive: true, force: true });
      const lines = await runBench(name, BENCHES[name]!, opts, profileDir);
      for (const l of lines) {
        const m = l.machine as Record<string, unknown> | undefined;
        if (m && quiet?.busy !== undefined) m.others_runnable_at_start = Number(quiet.busy.toFixed(1));
        const share = coreShare(l);
        if (m && share !== undefined) m.core_share = Number(share.toFixed(3));
        if (m) m.attempt = attempt + 1;
      }
      const share = (ls: ResultLine[]) => Math.min(...ls.map((l) => coreShare(l) ?? 1));
      if (!best || share(lines) > share(best)) best = lines;
      if (share(lines) >= CONTENDED) break;
    }
    const lines = best!;
    for (const l of lines) process.stdout.write(`${JSON.stringify(l)}\n`);
    results.push(...lines);
    save();
    if (profileDir && existsSync(profileDir) && profileFiles([profileDir]).length > 0) {
      const text = formatSummary(summarise(profileFiles([profileDir])), `profile ${name}`);
      writeFileAtomic(join(profileDir, "summary.txt"), `${text}\n`);
      process.stderr.write(`${text}\n  (profiles and summary.txt in ${profileDir})\n`);
    }
  }
  // A PyTorch run of this suite wins over one read from --pytorch FILE.
  const pytorchRun = results.find((r) => r.name === "pytorch_actor_update" && r.figures);
  const targets = checkTargets(results, pytorchRun ?? pytorchFile);
  results.push(targets);
  save();
  process.stdout.write(`${JSON.stringify(targets)}\n`);
  process.stderr.write(`\n${formatTable(results)}\n`);
  process.stderr.write(`bench: ${opts.only.length} benchmark(s) in ${((performance.now() - t0) / 1000).toFixed(0)} s; results in ${outFile}\n`);
  if (results.some((r) => "error" in r)) process.exitCode = 1;
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 2;
});
