// Experiment tracking: `trainer.logger` names one or more backends, each step's
// metrics fan out to all of them. Backends live in a registry so users can add
// their own (registerTrackingBackend). Built in: `console` (verl's LocalLogger line
// `step:N - k:v - ...` on stdout, plus a progress bar on stderr when it is a
// terminal) and `file` (JSONL `{"step", "data"}` lines, verl's FileLogger).
import { appendFileSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { writeErrorAt, writeFileAtomic } from "./fs.js";

export interface TrackingBackend {
  /** True for backends that only display (console): they log after the ones that persist. */
  readonly displayOnly?: boolean;
  log(data: Record<string, unknown>, step: number): void;
  /** Called once before the first log, with the step training resumes from (0 = fresh run). */
  begin?(resumedStep: number): void;
  finish?(): void;
}

export interface TrackingOptions {
  projectName: string;
  experimentName: string;
  config?: unknown;
  /** For the console progress bar. */
  totalSteps?: number;
}

export type TrackingBackendFactory = (opts: TrackingOptions) => TrackingBackend;

const registry = new Map<string, TrackingBackendFactory>();

/** verl backends that need a network service or a Python client; named so the error is clear. */
const UNAVAILABLE = ["wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "clearml", "trackio", "tracking"];

export function registerTrackingBackend(name: string, factory: TrackingBackendFactory): void {
  const prev = registry.get(name);
  if (prev && prev !== factory) throw new Error(`tracking backend '${name}' is already registered with a different factory`);
  registry.set(name, factory);
}

export function knownTrackingBackends(): string[] {
  return [...registry.keys()].sort();
}

function createBackend(name: string, opts: TrackingOptions): TrackingBackend {
  const factory = registry.get(name);
  if (factory) return factory(opts);
  const known = knownTrackingBackends().join(", ");
  if (UNAVAILABLE.includes(name)) {
    throw new Error(
      `trainer.logger: backend '${name}' is not available in verl-ts (it needs a network service or a Python client); ` +
      `use one of: ${known} (e.g. trainer.logger='["console","file"]')`,
    );
  }
  throw new Error(`trainer.logger: unknown backend '${name}'; known backends: ${known}`);
}

/** `trainer.logger` as a list: a string, a list of strings, or null (no backends). */
export function loggerList(value: unknown): string[] {
  if (value === null || value === undefined) return [];
  if (typeof value === "string") return value === "" ? [] : [value];
  if (Array.isArray(value) && value.every((v) => typeof v === "string")) return value as string[];
  throw new Error(`trainer.logger must be a backend name or a list of names, got ${JSON.stringify(value)}`);
}

export class Tracking {
  private readonly backends = new Map<string, TrackingBackend>();
  private begun = false;

  constructor(readonly opts: TrackingOptions & { backends: unknown }) {
    for (const name of loggerList(opts.backends)) {
      if (!this.backends.has(name)) this.backends.set(name, createBackend(name, opts));
    }
  }

  get backendNames(): string[] {
    return [...this.backends.keys()];
  }

  /** Declare where the run starts: backends with history (file) drop entries after `resumedStep`. */
  begin(resumedStep: number): void {
    if (this.begun) return;
    this.begun = true;
    for (const b of this.backends.values()) b.begin?.(resumedStep);
  }

  log(data: Record<string, unknown>, step: number, backend?: string): void {
    this.begin(0);
    // Persisting backends first: a step line seen on the console is already on disk,
    // so a kill -9 right after it loses nothing a resume needs.
    for (const displayPass of [false, true]) {
      for (const [name, b] of this.backends) {
        if (Boolean(b.displayOnly) === displayPass && (!backend || backend === name)) b.log(data, step);
      }
    }
  }

  finish(): void {
    for (const b of this.backends.values()) b.finish?.();
  }
}

// ---- console -------------------------------------------------------------------------------

/** verl's console line: `step:N - key:value - ...` with numeric values only. */
export function formatConsoleLine(data: Record<string, unknown>, step: number): string {
  const parts = [`step:${step}`];
  for (const [k, v] of Object.entries(data)) {
    if (typeof v === "number") parts.push(`${k}:${v}`);
    else if (typeof v === "boolean") parts.push(`${k}:${v ? 1 : 0}`);
  }
  return parts.join(" - ");
}

class ConsoleBackend implements TrackingBackend {
  readonly displayOnly = true;
  private readonly bar: boolean;
  private startTime = Date.now();
  private firstStep: number | undefined;

  constructor(private readonly totalSteps?: number) {
    this.bar = Boolean(process.stderr.isTTY) && totalSteps !== undefined && totalSteps > 0;
  }

  log(data: Record<string, unknown>, step: number): void {
    if (this.bar) process.stderr.write("\r\x1b[K");
    process.stdout.write(formatConsoleLine(data, step) + "\n");
    if (this.bar) this.drawBar(step);
  }

  private drawBar(step: number): void {
    const total = this.totalSteps!;
    this.firstStep ??= step;
    const width = 30;
    const done = Math.max(0, Math.min(width, Math.round((step / total) * width)));
    const elapsed = (Date.now() - this.startTime) / 1000;
    const stepsRun = step - this.firstStep + 1;
    const perStep = stepsRun > 0 ? elapsed / stepsRun : 0;
    const eta = Math.max(0, (total - step) * perStep);
    process.stderr.write(`[${"=".repeat(done)}${" ".repeat(width - done)}] step ${step}/${total}  ${perStep.toFixed(2)} s/step  eta ${eta.toFixed(0)} s`);
  }

  finish(): void {
    if (this.bar) process.stderr.write("\n");
  }
}

// ---- file ----------------------------------------------------------------------------------

/** Where the file backend writes: $VERL_FILE_LOGGER_PATH, else $VERL_FILE_LOGGER_ROOT (default outputs/metrics)/{project}/{experiment}.jsonl. */
export function fileLoggerPath(projectName: string, experimentName: string, env: NodeJS.ProcessEnv = process.env): string {
  if (env.VERL_FILE_LOGGER_PATH) return resolve(env.VERL_FILE_LOGGER_PATH);
  const root = env.VERL_FILE_LOGGER_ROOT ?? join("outputs", "metrics");
  return resolve(root, projectName, `${experimentName}.jsonl`);
}

class FileBackend implements TrackingBackend {
  readonly path: string;

  constructor(opts: TrackingOptions) {
    this.path = fileLoggerPath(opts.projectName, opts.experimentName);
  }

  /** A fresh run starts an empty file; a resumed run keeps the lines up to the resumed step. */
  begin(resumedStep: number): void {
    mkdirSync(dirname(this.path), { recursive: true });
    let kept = "";
    if (resumedStep > 0 && existsSync(this.path)) {
      kept = readFileSync(this.path, "utf8")
        .split("\n")
        .filter((line) => {
          if (!line.trim()) return false;
          try {
            const rec = JSON.parse(line) as { step?: unknown };
            return typeof rec.step === "number" && rec.step <= resumedStep;
          } catch {
            return false;
          }
        })
        .map((l) => l + "\n")
        .join("");
    }
    writeFileAtomic(this.path, kept);
  }

  log(data: Record<string, unknown>, step: number): void {
    try {
      appendFileSync(this.path, JSON.stringify({ step, data }) + "\n");
    } catch (e) {
      throw writeErrorAt(this.path, e, "the metrics file");
    }
  }
}

registerTrackingBackend("console", (o) => new ConsoleBackend(o.totalSteps));
registerTrackingBackend("file", (o) => new FileBackend(o));
