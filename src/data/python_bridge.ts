// verl's Python data classes run by verl-ts: data.custom_cls datasets and data.sampler samplers live
// in one python3 process (src/data/python/bridge.py) that verl-ts talks to in JSON lines. The
// dataloader's interface is synchronous (get(i), an index iterator), so each call is made
// synchronously: a worker thread owns the process and its pipes, and the calling thread sleeps on
// a shared flag until the worker hands the reply over (receiveMessageOnPort). While Python works
// on a call it may ask back (a row of verl-ts's own dataset for a sampler's data_source, a column
// of the batch given to update()); the calling thread serves those between waits.
// Every call has data.python_timeout_s; past it the process is killed and the run fails naming the
// class and the call. Python's exceptions come back with their traceback. A process is never
// restarted (the dataset and the sampler live in it), and it dies with Node.
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import type { DataProto } from "../protocol/data_proto.js";
import { nonFinite, PythonCallError, pythonExecutable, runnerScript, shippedPython, toJson } from "../reward/python_process.js";
import { collateToDataProto, truncateIds } from "./collate.js";
import { readDataConfig, type RLDataConfig } from "./data_config.js";
import type { BatchSource, IndexSampler } from "./dataloader.js";
import { promptTokenIds, type RLHFDatasetOptions, type RLRow } from "./rl_dataset.js";

// The worker: spawns python3, writes request lines, arms the call's timeout, and hands every
// reply line (or the process's end) to the calling thread. CommonJS, run with eval.
const WORKER = `
const { workerData, parentPort } = require("node:worker_threads");
const { spawn } = require("node:child_process");
const { createInterface } = require("node:readline");
const { python, args, flag, port, startTimeoutMs } = workerData;
const signal = new Int32Array(flag);
const deliver = (m) => { port.postMessage(m); Atomics.store(signal, 0, 1); Atomics.notify(signal, 0); };
let timer = null;
const child = spawn(python, args, { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, PYTHONUNBUFFERED: "1", PYTHONDONTWRITEBYTECODE: "1" } });
const arm = (ms) => {
  clearTimeout(timer);
  timer = setTimeout(() => { timer = null; child.kill("SIGKILL"); deliver({ timeout: true }); }, ms);
};
child.stdin.on("error", () => undefined);
child.on("error", (e) => { clearTimeout(timer); deliver({ spawnError: e.code || "", message: e.message }); });
child.on("exit", (code, sig) => { clearTimeout(timer); deliver({ exit: sig || "code " + code }); });
if (child.pid) deliver({ pid: child.pid });
createInterface({ input: child.stdout }).on("line", (line) => { clearTimeout(timer); timer = null; deliver({ line }); });
arm(startTimeoutMs);
parentPort.on("message", (m) => {
  if (m.close) { clearTimeout(timer); child.stdin.end(); child.kill("SIGKILL"); return; }
  arm(m.timeoutMs);
  child.stdin.write(m.line + "\\n");
});
`;

interface WorkerMsg { pid?: number; line?: string; timeout?: true; exit?: string; spawnError?: string; message?: string }
interface Reply { id?: number; ready?: boolean; ok?: boolean; value?: unknown; error?: string; traceback?: string; callback?: string; [k: string]: unknown }
/** What Python asks back during a call: a row of verl-ts's dataset, a column of an update() batch. */
export type Callback = (req: Reply) => unknown;

const live = new Set<number>();
let exitHook = false;

/** One python3 running bridge.py, called synchronously. `what` names the config keys in errors. */
export class PythonBridge {
  private readonly worker: Worker;
  private readonly port: MessagePort;
  private readonly signal: Int32Array;
  private pid: number | undefined;
  private gone: string | null = null;
  private nextId = 0;
  private nextHandle = 0;

  constructor(readonly what: string, readonly timeoutMs: number) {
    const flag = new SharedArrayBuffer(4);
    this.signal = new Int32Array(flag);
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    this.worker = new Worker(WORKER, {
      eval: true,
      workerData: { python: pythonExecutable(), args: ["-u", shippedPython("data/python/bridge.py", "runs Python data classes"), runnerScript()], flag, port: port2, startTimeoutMs: timeoutMs },
      transferList: [port2],
    });
    this.worker.unref();
    if (!exitHook) {
      exitHook = true;
      process.on("exit", () => { for (const pid of live) try { process.kill(pid, "SIGKILL"); } catch { /* already gone */ } });
    }
    const ready = this.await("starting python3 and bridge.py");
    if (!ready.ready) throw new Error(`${this.what}: the Python bridge did not start: ${JSON.stringify(ready).slice(0, 300)}`);
  }

  handle(): number {
    return this.nextHandle++;
  }

  private fail(why: string): never {
    this.gone = why;
    this.close();
    throw new PythonCallError(why, why.includes("timeout") ? "timeout" : "error");
  }

  /** The next line from Python (worker messages about the process handled on the way). */
  private await(label: string): Reply {
    const deadline = Date.now() + this.timeoutMs + 10_000;
    for (;;) {
      Atomics.store(this.signal, 0, 0);
      const got = receiveMessageOnPort(this.port);
      if (!got) {
        const left = deadline - Date.now();
        if (left <= 0 || Atomics.wait(this.signal, 0, 0, left) === "timed-out") this.fail(`${this.what}: ${label}: the Python bridge's worker thread stopped answering`);
        continue;
      }
      const m = got.message as WorkerMsg;
      if (m.pid !== undefined) { this.pid = m.pid; live.add(m.pid); continue; }
      if (m.line !== undefined) {
        try {
          return JSON.parse(m.line, nonFinite) as Reply;
        } catch {
          this.fail(`${this.what}: ${label}: unreadable line from the Python bridge: ${m.line.slice(0, 200)}`);
        }
      }
      const python = pythonExecutable();
      const named = process.env.VERL_PYTHON ? `VERL_PYTHON=${python}` : python;
      if (m.timeout) this.fail(`${this.what}: ${label} ran past its ${this.timeoutMs / 1000} s timeout (data.python_timeout_s; the Python process was killed)`);
      if (m.spawnError !== undefined) {
        this.fail(m.spawnError === "ENOENT"
          ? `${this.what} is a Python class, which needs \`${python}\`: not found (install Python 3, or set VERL_PYTHON to an interpreter)`
          : `${this.what}: cannot start ${named}: ${m.message}`);
      }
      if (m.exit !== undefined) {
        this.fail(this.nextId === 0
          ? `${named} exited (${m.exit}) before it started verl-ts's bridge for ${this.what}: it does not look like a working Python 3 interpreter (try \`${python} --version\`; VERL_PYTHON picks another)`
          : `${this.what}: the Python process exited (${m.exit}) during ${label}`);
      }
    }
  }

  private send(msg: unknown): void {
    this.worker.postMessage({ line: toJson(msg), timeoutMs: this.timeoutMs });
  }

  /** op(args) in Python; `label` names the call in errors; `callback` answers Python's requests meanwhile. */
  call(op: string, args: Record<string, unknown>, label: string, callback?: Callback): unknown {
    if (this.gone) throw new Error(`${this.what}: ${label}: the Python process is gone (${this.gone.split("\n")[0]})`);
    const id = this.nextId++;
    this.send({ id, op, ...args });
    for (;;) {
      const r = this.await(label);
      if (r.callback !== undefined) {
        let answer: Record<string, unknown>;
        try {
          if (!callback) throw new Error(`nothing answers '${r.callback}' during ${label}`);
          answer = { callback_reply: callback(r) ?? null };
        } catch (e) {
          answer = { callback_error: (e as Error).message ?? String(e) };
        }
        this.send(answer);
        continue;
      }
      if (r.id !== id) this.fail(`${this.what}: ${label}: reply ${r.id} for request ${id}`);
      if (r.ok) return r.value;
      // bridge.py's own checks say it all; the user's exceptions come with their traceback
      if (r.plain) throw new PythonCallError(`${label}: ${r.error}`, "error");
      throw new PythonCallError(`${label} raised: ${r.error}\n${r.traceback ?? ""}`.trimEnd(), "error", r.traceback);
    }
  }

  close(): void {
    if (this.pid !== undefined) {
      live.delete(this.pid);
      try { process.kill(this.pid, "SIGKILL"); } catch { /* already gone */ }
    }
    this.worker.postMessage({ close: true });
    void this.worker.terminate();
    this.gone ??= "closed";
  }
}

export interface PythonClassSpec { path: string; name: string; label: string }

const asObject = (v: unknown): Record<string, unknown> | null =>
  v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : null;

function isMessages(v: unknown): v is ChatMessage[] {
  return Array.isArray(v) && v.length > 0 && v.every((m) => asObject(m) !== null && typeof (m as ChatMessage).role === "string" && typeof (m as ChatMessage).content === "string");
}

/** A 1-D list of ids from a list or a [1, n] nesting (a torch tensor's tolist()). */
function flatIds(v: unknown, key: string, where: string): number[] {
  let x = v;
  if (Array.isArray(x) && x.length === 1 && Array.isArray(x[0])) x = x[0];
  if (!Array.isArray(x) || !x.every((t) => Number.isInteger(t))) throw new Error(`${where}: '${key}' must be a list of token ids`);
  return x as number[];
}

const DROPPED = ["input_ids", "attention_mask", "position_ids", "raw_prompt_ids", "dummy_tensor"];

/**
 * One row of a verl dataset as verl-ts's rows are: raw_prompt messages (from raw_prompt, else the
 * data.prompt_key column) are what the rollout templates with verl-ts's own chat template; token
 * ids are used only where a row has no messages (raw_prompt_ids, else input_ids without its left
 * padding). index / tools_kwargs / interaction_kwargs fall back to extra_info as in RLHFDataset;
 * multi-modal rows are refused.
 */
export function rowFromPython(raw: unknown, cfg: RLDataConfig, tokenizer: Tokenizer | null, tools: unknown[] | undefined, where: string): RLRow {
  const row = asObject(raw);
  if (!row) throw new Error(`${where}: a row must be a dict, got ${JSON.stringify(raw)?.slice(0, 100)}`);
  for (const k of ["multi_modal_data", "multi_modal_inputs", "images", "videos"]) {
    const v = row[k];
    if (v !== undefined && v !== null && !(Array.isArray(v) && v.length === 0) && !(asObject(v) && Object.keys(v as object).length === 0)) {
      throw new Error(`${where}: the row carries '${k}' (images or videos); verl-ts trains text models only, so multi-modal rows are not supported`);
    }
  }
  const messages = isMessages(row.raw_prompt) ? row.raw_prompt : isMessages(row[cfg.promptKey]) ? row[cfg.promptKey] as ChatMessage[] : null;
  let ids: number[] | undefined;
  if (messages) {
    if (tokenizer) ids = promptTokenIds(tokenizer, messages, cfg, tools, where);
  } else if (row.raw_prompt_ids !== undefined && row.raw_prompt_ids !== null) {
    ids = flatIds(row.raw_prompt_ids, "raw_prompt_ids", where);
  } else if (row.input_ids !== undefined && row.input_ids !== null) {
    ids = flatIds(row.input_ids, "input_ids", where);
    if (row.attention_mask !== undefined) {
      const mask = flatIds(row.attention_mask, "attention_mask", where);
      if (mask.length !== ids.length) throw new Error(`${where}: attention_mask has ${mask.length} entries, input_ids ${ids.length}`);
      ids = ids.filter((_, j) => mask[j] === 1);
    }
  } else {
    throw new Error(`${where}: the row has no prompt: neither raw_prompt messages, a '${cfg.promptKey}' column of messages (data.prompt_key), raw_prompt_ids nor input_ids`);
  }
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(row)) if (!DROPPED.includes(k)) out[k] = v;
  const extra = asObject(row.extra_info) ?? {};
  out.extra_info = extra;
  out.index = typeof row.index === "number" ? row.index : typeof extra.index === "number" ? extra.index : 0;
  out.tools_kwargs = asObject(row.tools_kwargs) ?? asObject(extra.tools_kwargs) ?? {};
  out.interaction_kwargs = asObject(row.interaction_kwargs) ?? asObject(extra.interaction_kwargs) ?? {};
  if (messages) out.raw_prompt = messages.map((m) => ({ ...m }));
  if (ids) out.input_ids = truncateIds(ids, cfg.maxPromptLength, cfg.truncation, where);
  return out as RLRow;
}

/** data.custom_cls naming a Python class: built in the bridge as verl builds it, rows served by index. */
export class PythonDataset implements BatchSource<RLRow> {
  readonly handle: number;
  readonly length: number;
  private readonly cfg: RLDataConfig;

  constructor(
    readonly bridge: PythonBridge, readonly spec: PythonClassSpec, files: string[], private readonly tokenizer: Tokenizer | null,
    data: Record<string, unknown>, private readonly opts: RLHFDatasetOptions & { tokenizerPath: string | null; trustRemoteCode: boolean },
  ) {
    this.cfg = readDataConfig(data);
    if (!opts.tokenizerPath) throw new Error(`data.custom_cls (${spec.label}): a verl dataset class is built with the model's Hugging Face tokenizer, and actor_rollout_ref.model.path is not set`);
    this.handle = bridge.handle();
    const r = bridge.call("dataset", {
      handle: this.handle, path: spec.path, name: spec.name, data_files: files, config: data,
      max_samples: opts.maxSamples ?? -1, tokenizer_path: opts.tokenizerPath, trust_remote_code: opts.trustRemoteCode,
    }, `data.custom_cls (${spec.label}): building it`) as { length: unknown };
    if (!Number.isInteger(r.length) || (r.length as number) < 0) throw new Error(`data.custom_cls (${spec.label}): len() must be a non-negative integer, got ${JSON.stringify(r.length)}`);
    this.length = r.length as number;
  }

  /** The row as Python returns it (for a sampler's data_source), and as verl-ts rows are. */
  raw(i: number): unknown {
    return this.bridge.call("get", { handle: this.handle, index: i }, `data.custom_cls (${this.spec.label}): __getitem__(${i})`);
  }

  get(i: number): RLRow {
    return rowFromPython(this.raw(i), this.cfg, this.tokenizer, this.opts.tools, `data.custom_cls (${this.spec.label}): row ${i}`);
  }

  collate(rows: RLRow[]): DataProto {
    return collateToDataProto(rows, { maxPromptLength: this.cfg.maxPromptLength, padTokenId: this.tokenizer?.padTokenId ?? 0, truncation: this.cfg.truncation });
  }
}

/** The columns of a trained batch, as bridge.py's BatchView fetches them. */
function batchField(batch: DataProto, req: Reply): unknown {
  const key = String(req.key);
  if (req.kind === "tensor") {
    const t = batch.batch[key];
    if (!t) throw new Error(`the batch has no tensor '${key}'`);
    return { values: Array.from(t.data as ArrayLike<number>, (x) => (t.dtype === "bool" ? x !== 0 : x)), shape: t.shape, dtype: t.dtype };
  }
  const col = batch.nonTensorBatch[key];
  if (!col) throw new Error(`the batch has no column '${key}'`);
  return col;
}

/** data.sampler naming a Python class (verl's AbstractSampler / AbstractCurriculumSampler). */
export class PythonSampler implements IndexSampler {
  readonly handle: number;
  readonly length?: number;
  update?: (batch: DataProto) => void;
  stateDict?: () => unknown;
  loadStateDict?: (state: unknown) => void;

  constructor(readonly bridge: PythonBridge, readonly spec: PythonClassSpec, dataset: BatchSource<RLRow>, data: Record<string, unknown>) {
    this.handle = bridge.handle();
    const label = `data.sampler (${spec.label})`;
    const own = dataset instanceof PythonDataset && dataset.bridge === bridge;
    const r = bridge.call("sampler", {
      handle: this.handle, path: spec.path, name: spec.name, config: data,
      dataset: own ? dataset.handle : null, rows: 0, length: dataset.length,
    }, `${label}: building it`, (req) => {
      if (req.callback !== "row") throw new Error(`unknown request '${req.callback}'`);
      return dataset.get(req.index as number);
    }) as { length: unknown; curriculum: boolean; stateful: boolean };
    if (r.length !== null) {
      if (!Number.isInteger(r.length) || (r.length as number) < 0) throw new Error(`${label}: len() must be a non-negative integer, got ${JSON.stringify(r.length)}`);
      this.length = r.length as number;
    }
    this.rowOf = (i) => dataset.get(i);
    if (r.curriculum) {
      this.update = (batch) => {
        this.bridge.call("update", {
          handle: this.handle,
          batch: { size: batch.length, tensor_keys: Object.keys(batch.batch), non_tensor_keys: Object.keys(batch.nonTensorBatch), meta_info: batch.metaInfo },
        }, `${label}: update(batch)`, (req) => (req.callback === "field" ? batchField(batch, req) : this.rowOf(req.index as number)));
      };
    }
    if (r.stateful) {
      this.stateDict = () => this.bridge.call("state_dict", { handle: this.handle }, `${label}: state_dict()`);
      this.loadStateDict = (state) => { this.bridge.call("load_state_dict", { handle: this.handle, state }, `${label}: load_state_dict()`); };
    }
  }

  private readonly rowOf: (i: number) => unknown;

  *[Symbol.iterator](): Iterator<number> {
    const label = `data.sampler (${this.spec.label})`;
    const rows = (req: Reply) => this.rowOf(req.index as number);
    this.bridge.call("iter", { handle: this.handle }, `${label}: iter()`, rows);
    for (;;) {
      const i = this.bridge.call("next", { handle: this.handle }, `${label}: next index`, rows);
      if (i === null) return;
      yield i as number;
    }
  }
}
