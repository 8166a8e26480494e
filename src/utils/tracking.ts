// Experiment tracking: `trainer.logger` names one or more backends, each step's
// metrics fan out to all of them. Backends live in a registry so users can add
// their own (registerTrackingBackend). Built in: `console` (verl's LocalLogger line
// `step:N - k:v - ...` on stdout, plus a progress bar on stderr when it is a
// terminal), `file` (JSONL `{"step", "data"}` lines, verl's FileLogger) and
// `tensorboard` (event files). verl's service-backed loggers (wandb, mlflow, ...)
// are replaced by `file` with one warning, so verl's scripts run as they are.
import { appendFileSync, existsSync, mkdirSync, readFileSync, renameSync, statSync } from "node:fs";
import { basename, dirname, extname, join, resolve } from "node:path";
import { writeErrorAt, writeFileAtomic } from "./fs.js";
import { logger } from "./logger.js";
import { TensorboardBackend } from "./tensorboard/backend.js";

export interface TrackingBackend {
  /** True for backends that only display (console): they log after the ones that persist. */
  readonly displayOnly?: boolean;
  log(data: Record<string, unknown>, step: number): void;
  /**
   * Called once before the first log, with the step training resumes from (0 = fresh run) and,
   * when the checkpoint kept them, that step's metrics (for backends with history to replay).
   */
  begin?(resumedStep: number, resumedStepMetrics?: Record<string, unknown>, opts?: ResumeOptions): void;
  finish?(): void;
}

export interface ResumeOptions {
  /**
   * How many rows the resumed step had in an uninterrupted run (the PPO trainer logs one a step);
   * rows past them are earlier restarts' validation-before-training rows, dropped because this
   * restart logs its own. Unset: every row kept (SFT logs train and validation rows apart).
   */
  rowsAtResumedStep?: number;
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

/** verl's backends that need a network service or a Python client (`tracking` is verl's deprecated name for wandb). */
export const SERVICE_BACKENDS = ["wandb", "mlflow", "swanlab", "vemlp_wandb", "clearml", "trackio", "tracking"];
/** What stands in for them: the local record of every metric. */
const STAND_IN = "file";

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
  const known = [...knownTrackingBackends(), ...SERVICE_BACKENDS.filter((b) => b !== "tracking")].sort().join(", ");
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

  /** The service backends asked for and replaced by the file backend. */
  readonly replaced: string[] = [];

  constructor(readonly opts: TrackingOptions & { backends: unknown }) {
    const names = loggerList(opts.backends);
    // A user backend registered under a service name (a real wandb client, say) wins over the stand-in.
    for (const name of names) if (SERVICE_BACKENDS.includes(name) && !registry.has(name) && !this.replaced.includes(name)) this.replaced.push(name);
    const used = names.filter((n) => !this.replaced.includes(n));
    if (this.replaced.length > 0 && !used.includes(STAND_IN)) used.push(STAND_IN);
    for (const name of used) {
      if (!this.backends.has(name)) this.backends.set(name, createBackend(name, opts));
    }
    if (this.replaced.length > 0) {
      logger().warn(
        { replaced: this.replaced, instead: STAND_IN, path: fileLoggerPath(opts.projectName, opts.experimentName) },
        `trainer.logger: ${this.replaced.join(", ")} not available in verl-ts (network service or Python client); ` +
          `their metrics go to the '${STAND_IN}' backend (JSONL) instead, with: ${[...this.backends.keys()].join(", ")}`,
      );
    }
  }

  get backendNames(): string[] {
    return [...this.backends.keys()];
  }

  /**
   * Declare where the run starts: backends with history (file) drop entries after `resumedStep`,
   * and add that step's metrics (from its checkpoint) when they never got them.
   */
  begin(resumedStep: number, resumedStepMetrics?: Record<string, unknown>, opts: ResumeOptions = {}): void {
    if (this.begun) return;
    this.begun = true;
    for (const b of this.backends.values()) b.begin?.(resumedStep, resumedStepMetrics, opts);
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

/** The plain progress line: `progress: step 5/20 (25%), 6.10 s/step, ETA 1 min 32 s`. */
export function progressLine(step: number, total: number, perStep: number): string {
  const eta = Math.round(Math.max(0, (total - step) * perStep));
  const etaText = eta >= 60 ? `${Math.floor(eta / 60)} min ${eta % 60} s` : `${eta} s`;
  return `progress: step ${step}/${total} (${Math.floor((100 * step) / total)}%), ${perStep.toFixed(2)} s/step, ETA ${etaText}`;
}

export class ConsoleBackend implements TrackingBackend {
  readonly displayOnly = true;
  private readonly bar: boolean;
  private startTime = Date.now();
  private firstStep: number | undefined;

  private readonly plain: { everySteps: number; everyMs: number } | undefined;
  private lastPlain = { step: Number.NEGATIVE_INFINITY, at: Date.now() };

  constructor(private readonly totalSteps?: number, tty = Boolean(process.stderr.isTTY), env: NodeJS.ProcessEnv = process.env) {
    const known = totalSteps !== undefined && totalSteps > 0;
    this.bar = tty && known;
    // Not a terminal (CI, a log file): a plain progress line every N steps or S seconds instead of the bar.
    this.plain = !tty && known
      ? { everySteps: Math.max(1, Number(env.VERL_PROGRESS_EVERY_STEPS ?? 10)), everyMs: 1000 * Math.max(0, Number(env.VERL_PROGRESS_EVERY_S ?? 60)) }
      : undefined;
  }

  log(data: Record<string, unknown>, step: number): void {
    if (this.bar) process.stderr.write("\r\x1b[K");
    process.stdout.write(formatConsoleLine(data, step) + "\n");
    if (this.bar) this.drawBar(step);
    else if (this.plain) this.plainProgress(step);
  }

  private perStep(step: number): number {
    this.firstStep ??= step;
    const stepsRun = step - this.firstStep + 1;
    return stepsRun > 0 ? (Date.now() - this.startTime) / 1000 / stepsRun : 0;
  }

  private plainProgress(step: number): void {
    const p = this.plain!;
    const total = this.totalSteps!;
    const now = Date.now();
    const due = step >= total || step === this.firstStep || step - this.lastPlain.step >= p.everySteps || (p.everyMs > 0 && now - this.lastPlain.at >= p.everyMs);
    const perStep = this.perStep(step);
    if (!due && this.lastPlain.step !== Number.NEGATIVE_INFINITY) return;
    this.lastPlain = { step, at: now };
    process.stderr.write(progressLine(step, total, perStep) + "\n");
  }

  private drawBar(step: number): void {
    const total = this.totalSteps!;
    const width = 30;
    const done = Math.max(0, Math.min(width, Math.round((step / total) * width)));
    const perStep = this.perStep(step);
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

  /**
   * A resumed run keeps the lines up to the resumed step. A fresh run starts an empty file; an
   * earlier run's lines are kept, moved to `<name>.<n>.jsonl` (the next free n), so that each file
   * stays one run in verl's format.
   */
  begin(resumedStep: number, resumedStepMetrics?: Record<string, unknown>, opts: ResumeOptions = {}): void {
    mkdirSync(dirname(this.path), { recursive: true });
    if (resumedStep === 0) this.keepEarlierRun();
    const kept: { step: number; line: string }[] = [];
    if (resumedStep > 0 && existsSync(this.path)) {
      for (const line of readFileSync(this.path, "utf8").split("\n")) {
        if (!line.trim()) continue;
        try {
          const rec = JSON.parse(line) as { step?: unknown };
          // Restarts must not pile up rows at the resumed step: verl validates on every resume and
          // logs it there, and this restart writes its own (opts.rowsAtResumedStep).
          if (typeof rec.step !== "number" || rec.step > resumedStep) continue;
          const limit = opts.rowsAtResumedStep;
          if (rec.step === resumedStep && limit !== undefined && kept.filter((k) => k.step === resumedStep).length >= limit) continue;
          kept.push({ step: rec.step, line });
        } catch {
          // a line cut short by a kill: dropped
        }
      }
    }
    if (resumedStep > 0 && resumedStepMetrics && !kept.some((k) => k.step === resumedStep)) {
      kept.push({ step: resumedStep, line: JSON.stringify({ step: resumedStep, data: resumedStepMetrics }) });
      logger().info({ step: resumedStep, metrics: this.path }, "the resumed step's metrics line was missing (a kill after its checkpoint); replayed it from the checkpoint");
    }
    writeFileAtomic(this.path, kept.map((k) => k.line + "\n").join(""));
  }

  log(data: Record<string, unknown>, step: number): void {
    try {
      appendFileSync(this.path, JSON.stringify({ step, data }) + "\n");
    } catch (e) {
      throw writeErrorAt(this.path, e, "the metrics file");
    }
  }

  private keepEarlierRun(): void {
    if (!existsSync(this.path) || statSync(this.path).size === 0) return;
    const ext = extname(this.path), stem = join(dirname(this.path), basename(this.path, ext));
    let n = 1;
    while (existsSync(`${stem}.${n}${ext}`)) n++;
    const moved = `${stem}.${n}${ext}`;
    renameSync(this.path, moved);
    logger().warn({ metrics: this.path, earlierRun: moved }, "a fresh run with the same project and experiment names: the earlier run's metrics were moved aside");
  }
}

registerTrackingBackend("console", (o) => new ConsoleBackend(o.totalSteps));
registerTrackingBackend("file", (o) => new FileBackend(o));
registerTrackingBackend("tensorboard", (o) => new TensorboardBackend(o.projectName, o.experimentName));
