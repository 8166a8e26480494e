// One persistent python3 process running a verl reward function (see
// python/runner.py): JSON lines over stdin/stdout, one call at a time. A call
// that runs past its timeout kills the process (a hung Python loop cannot be
// interrupted otherwise); the next call starts a fresh one. Idle processes never
// keep Node alive, and every one still running is killed when Node exits.
import { spawn, type ChildProcessByStdio } from "node:child_process";
import type { Readable, Writable } from "node:stream";

type PythonChild = ChildProcessByStdio<Writable, Readable, null>;
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

/** The interpreter: $VERL_PYTHON, else python3 on PATH. */
export function pythonExecutable(env: NodeJS.ProcessEnv = process.env): string {
  return env.VERL_PYTHON || "python3";
}

/** A Python file the package ships under src/ (found from src/ under tsx or from dist/src when compiled); `role` says what it is for. */
export function shippedPython(rel: string, role: string): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    if (existsSync(join(dir, "package.json"))) {
      const p = join(dir, "src", rel);
      if (existsSync(p)) return p;
    }
    dir = dirname(dir);
  }
  throw new Error(`verl-ts is installed without src/${rel}, which ${role}`);
}

/** runner.py ships in the package's src/reward/python. */
export function runnerScript(): string {
  return shippedPython("reward/python/runner.py", "runs Python reward functions");
}

export class PythonCallError extends Error {
  constructor(message: string, readonly kind: "error" | "timeout", readonly pythonTraceback = "") {
    super(message);
  }
}

interface Reply {
  id?: number;
  ready?: boolean;
  ok?: boolean;
  value?: unknown;
  error?: string;
  traceback?: string;
}

const live = new Set<PythonChild>();
let exitHook = false;

/** JSON for Python: BigInt (int64 parquet columns) as numbers, typed arrays as lists. */
export function toJson(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) => {
    if (typeof x === "bigint") return Number(x);
    if (ArrayBuffer.isView(x) && !(x instanceof DataView)) return Array.from(x as unknown as ArrayLike<number>);
    return x;
  });
}

/** runner.py sends NaN and the infinities, which JSON lacks, as {"$nonfinite": "nan" | "inf" | "-inf"}. */
export function nonFinite(_k: string, v: unknown): unknown {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return v;
  const keys = Object.keys(v);
  if (keys.length !== 1 || keys[0] !== "$nonfinite") return v;
  const tag = (v as Record<string, unknown>).$nonfinite;
  return tag === "nan" ? NaN : tag === "inf" ? Infinity : tag === "-inf" ? -Infinity : v;
}

export interface PythonProcessOptions {
  /** The module (a .py path or pkg://dotted.module) and the function in it. */
  module: string;
  fn: string;
  /** Per call, and for loading the module. */
  timeoutMs: number;
  /** Names the config key in errors (custom_reward_function.path). */
  key: string;
}

export class PythonRewardProcess {
  private child: PythonChild | null = null;
  private starting: Promise<void> | null = null;
  private nextId = 0;
  private waiting: ((r: Reply | Error) => void) | null = null;
  private busy = false;

  constructor(readonly opts: PythonProcessOptions) {}

  private describe(): string {
    return `${this.opts.fn} in ${this.opts.module}`;
  }

  /** Start the process and load the module; rejects with the import error, or when python3 is missing. */
  start(): Promise<void> {
    this.starting ??= this.spawn().catch((e: unknown) => {
      this.starting = null;
      throw e;
    });
    return this.starting;
  }

  private spawn(): Promise<void> {
    // A missing file is one line, not Python's traceback.
    if (this.opts.module.endsWith(".py") && !existsSync(this.opts.module)) {
      return Promise.reject(new PythonCallError(`${this.opts.key}=${this.opts.module}: no such file`, "error"));
    }
    const python = pythonExecutable();
    const child = spawn(python, ["-u", runnerScript(), this.opts.module, this.opts.fn], {
      stdio: ["pipe", "pipe", "inherit"],
      env: { ...process.env, PYTHONUNBUFFERED: "1" },
    });
    this.child = child;
    live.add(child);
    if (!exitHook) {
      exitHook = true;
      process.on("exit", () => { for (const c of live) c.kill("SIGKILL"); });
    }
    child.stdin.on("error", () => undefined); // a dead child's EPIPE shows up as its exit
    createInterface({ input: child.stdout }).on("line", (line) => {
      let msg: Reply;
      try {
        msg = JSON.parse(line, nonFinite) as Reply;
      } catch {
        return this.settle(new Error(`${this.describe()}: unreadable reply from the Python runner: ${line.slice(0, 200)}`));
      }
      this.settle(msg);
    });
    child.on("error", (e: NodeJS.ErrnoException) => {
      const why = e.code === "ENOENT"
        ? `${this.opts.key}=${this.opts.module} is a Python reward function, which needs \`${python}\`: not found on PATH ` +
          `(install Python 3, or set VERL_PYTHON to an interpreter)`
        : `${this.describe()}: cannot start ${python}: ${e.message}`;
      this.drop(child);
      this.settle(new Error(why));
    });
    let loaded = false;
    child.on("exit", (code, signal) => {
      if (this.child !== child) return;
      this.drop(child);
      const how = signal ?? `code ${code}`;
      this.settle(new Error(loaded
        ? `${this.describe()}: the Python process exited (${how})`
        : `${process.env.VERL_PYTHON ? `VERL_PYTHON=${python}` : python} exited (${how}) before it loaded ${this.opts.key}=${this.opts.module}: ` +
          `it does not look like a working Python 3 interpreter (try \`${python} --version\`; VERL_PYTHON picks another)`));
    });
    return this.request(null, `loading ${this.opts.module}`).then(() => {
      loaded = true;
    });
  }

  private drop(child: PythonChild): void {
    live.delete(child);
    if (this.child === child) {
      this.child = null;
      this.starting = null;
    }
  }

  private settle(r: Reply | Error): void {
    const w = this.waiting;
    this.waiting = null;
    w?.(r);
  }

  /** Hold Node open only while a call is in flight. */
  private setRef(on: boolean): void {
    const c = this.child;
    if (!c) return;
    for (const h of [c, c.stdin, c.stdout] as unknown as { ref(): void; unref(): void }[]) {
      if (on) h.ref();
      else h.unref();
    }
  }

  /** Send one request (null: wait for the ready line) and await its reply under the timeout. */
  private request(kwargs: Record<string, unknown> | null, label: string): Promise<Reply> {
    const child = this.child!;
    const id = this.nextId++;
    this.setRef(true);
    return new Promise<Reply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting = null;
        this.drop(child);
        child.kill("SIGKILL");
        reject(new PythonCallError(`${label} ran past its ${this.opts.timeoutMs / 1000} s timeout (reward_model.reward_kwargs.timeout_s; the Python process was killed)`, "timeout"));
      }, this.opts.timeoutMs);
      this.waiting = (r) => {
        clearTimeout(timer);
        this.setRef(false);
        if (r instanceof Error) return reject(r);
        if (kwargs === null) {
          if (r.ready) return resolve(r);
          this.drop(child);
          child.kill("SIGKILL");
          return reject(new PythonCallError(`cannot load ${this.opts.key}=${this.opts.module}: ${r.error}\n${r.traceback ?? ""}`.trimEnd(), "error", r.traceback));
        }
        if (r.id !== id) return reject(new Error(`${this.describe()}: reply ${r.id} for request ${id}`));
        resolve(r);
      };
      if (kwargs !== null) child.stdin.write(toJson({ id, kwargs }) + "\n");
    });
  }

  /** fn(**kwargs) in Python; rejects with PythonCallError on an exception or a timeout. `what` names the sample. */
  async call(kwargs: Record<string, unknown>, what: string): Promise<unknown> {
    if (this.busy) throw new Error(`${this.describe()}: one call at a time per Python process`);
    this.busy = true;
    try {
      await this.start();
      const r = await this.request(kwargs, `${this.describe()} on ${what}`);
      if (r.ok) return r.value;
      throw new PythonCallError(`${this.describe()} raised on ${what}: ${r.error}\n${r.traceback ?? ""}`.trimEnd(), "error", r.traceback);
    } finally {
      this.busy = false;
    }
  }

  close(): void {
    const c = this.child;
    if (!c) return;
    this.drop(c);
    c.stdin.end();
    c.kill("SIGKILL");
  }
}
