// verl's Python data classes run by verl-ts: data.custom_cls datasets and data.sampler samplers live
// in one python3 process (src/data/python/bridge.py) that verl-ts talks to in JSON lines. The
// dataloader's interface is synchronous (get(i), an index iterator), so each call is made
// synchronously: a worker thread owns the process and its pipes, and the calling thread sleeps on
// a shared flag until the worker hands the reply over (receiveMessageOnPort). While Python works
// on a call it may ask back (a row of verl-ts's own dataset for a sampler's data_source, a column
// of the batch given to update()); the calling thread serves those between waits.
// A training batch costs O(1) round trips: its rows come in one get_many call and its sampler
// indices in one next_many call, drawn only when the batch is due (after the previous step's
// update(), as verl's DataLoader draws them).
// Every call has data.python_timeout_s, re-armed for each item of a batched call (Python announces
// each row / index before it starts); past it the process is killed and the run fails naming the
// class and the call (the row, for a batch). Python's exceptions come back with their traceback. A
// process is never restarted (the dataset and the sampler live in it), and it dies with Node.
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import type { DataProto } from "../protocol/data_proto.js";
import { nonFinite, PythonCallError, pythonExecutable, runnerScript, shippedPython, toJson } from "../reward/python_process.js";
import { collateToDataProto, truncateIds } from "./collate.js";
import { readDataConfig, type RLDataConfig } from "./data_config.js";
import { rowsOf, type BatchSource, type IndexDraws, type IndexSampler } from "./dataloader.js";
import { promptTokenIds, type RLHFDatasetOptions, type RLRow } from "./rl_dataset.js";

// The worker: spawns python3, writes request lines, arms the call's timeout, and hands every
// reply line (or the process's end) to the calling thread. A batched call's {"at": k} lines re-arm
// the timeout here and are kept back (only one a second goes on, to tell the calling thread the
// call is alive); the last k rides on a timeout or an exit. CommonJS, run with eval.
const WORKER = `
const { workerData, parentPort } = require("node:worker_threads");
const { spawn } = require("node:child_process");
const { createInterface } = require("node:readline");
const { python, args, flag, port, startTimeoutMs } = workerData;
const signal = new Int32Array(flag);
const deliver = (m) => { port.postMessage(m); Atomics.store(signal, 0, 1); Atomics.notify(signal, 0); };
let timer = null;
let at = null, ms = startTimeoutMs, told = 0;
const child = spawn(python, args, { stdio: ["pipe", "pipe", "inherit"], env: { ...process.env, PYTHONUNBUFFERED: "1", PYTHONDONTWRITEBYTECODE: "1" } });
const arm = (ms) => {
  clearTimeout(timer);
  timer = setTimeout(() => { timer = null; child.kill("SIGKILL"); deliver({ timeout: true, at }); }, ms);
};
child.stdin.on("error", () => undefined);
child.on("error", (e) => { clearTimeout(timer); deliver({ spawnError: e.code || "", message: e.message }); });
child.on("exit", (code, sig) => { clearTimeout(timer); deliver({ exit: sig || "code " + code, at }); });
if (child.pid) deliver({ pid: child.pid });
createInterface({ input: child.stdout }).on("line", (line) => {
  if (line.startsWith('{"at": ')) {
    at = Number(line.slice(7, -1));
    arm(ms);
    if (Date.now() - told > 1000) { told = Date.now(); deliver({ alive: true }); }
    return;
  }
  clearTimeout(timer); timer = null; deliver({ line });
});
arm(startTimeoutMs);
parentPort.on("message", (m) => {
  if (m.close) { clearTimeout(timer); child.stdin.end(); child.kill("SIGKILL"); return; }
  if (m.fresh) { at = null; told = Date.now(); }
  ms = m.timeoutMs;
  arm(ms);
  child.stdin.write(m.line + "\\n");
});
`;

interface WorkerMsg { pid?: number; line?: string; alive?: true; timeout?: true; exit?: string; at?: number | null; spawnError?: string; message?: string }
interface Reply { id?: number; ready?: boolean; ok?: boolean; value?: unknown; error?: string; traceback?: string; callback?: string; [k: string]: unknown }
/** What Python asks back during a call: a row of verl-ts's dataset, a column of an update() batch. */
export type Callback = (req: Reply) => unknown;
/** A call's name in errors; a batched call's depends on the item it failed at (null: none yet). */
export type CallLabel = string | ((at: number | null) => string);
const labelAt = (label: CallLabel, at: number | null | undefined): string => (typeof label === "string" ? label : label(at ?? null));

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
  /** Requests sent and callbacks answered: the process round trips (tests count them). */
  readonly roundTrips = { calls: 0, callbacks: 0 };

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
  private await(label: CallLabel): Reply {
    let deadline = Date.now() + this.timeoutMs + 10_000;
    for (;;) {
      Atomics.store(this.signal, 0, 0);
      const got = receiveMessageOnPort(this.port);
      if (!got) {
        const left = deadline - Date.now();
        if (left <= 0 || Atomics.wait(this.signal, 0, 0, left) === "timed-out") this.fail(`${this.what}: ${labelAt(label, null)}: the Python bridge's worker thread stopped answering`);
        continue;
      }
      const m = got.message as WorkerMsg;
      if (m.pid !== undefined) { this.pid = m.pid; live.add(m.pid); continue; }
      if (m.alive) { deadline = Date.now() + this.timeoutMs + 10_000; continue; }
      if (m.line !== undefined) {
        try {
          return JSON.parse(m.line, nonFinite) as Reply;
        } catch {
          this.fail(`${this.what}: ${labelAt(label, null)}: unreadable line from the Python bridge: ${m.line.slice(0, 200)}`);
        }
      }
      const python = pythonExecutable();
      const named = process.env.VERL_PYTHON ? `VERL_PYTHON=${python}` : python;
      if (m.timeout) this.fail(`${this.what}: ${labelAt(label, m.at)} ran past its ${this.timeoutMs / 1000} s timeout (data.python_timeout_s; the Python process was killed)`);
      if (m.spawnError !== undefined) {
        this.fail(m.spawnError === "ENOENT"
          ? `${this.what} is a Python class, which needs \`${python}\`: not found (install Python 3, or set VERL_PYTHON to an interpreter)`
          : `${this.what}: cannot start ${named}: ${m.message}`);
      }
      if (m.exit !== undefined) {
        this.fail(this.nextId === 0
          ? `${named} exited (${m.exit}) before it started verl-ts's bridge for ${this.what}: it does not look like a working Python 3 interpreter (try \`${python} --version\`; VERL_PYTHON picks another)`
          : `${this.what}: the Python process exited (${m.exit}) during ${labelAt(label, m.at)}`);
      }
    }
  }

  private send(msg: unknown, fresh: boolean): void {
    this.worker.postMessage({ line: toJson(msg), timeoutMs: this.timeoutMs, fresh });
  }

  /** op(args) in Python; `label` names the call in errors; `callback` answers Python's requests meanwhile. */
  call(op: string, args: Record<string, unknown>, label: CallLabel, callback?: Callback): unknown {
    if (this.gone) throw new Error(`${this.what}: ${labelAt(label, null)}: the Python process is gone (${this.gone.split("\n")[0]})`);
    const id = this.nextId++;
    this.roundTrips.calls++;
    this.send({ id, op, ...args }, true);
    for (;;) {
      const r = this.await(label);
      if (r.callback !== undefined) {
        let answer: Record<string, unknown>;
        try {
          if (!callback) throw new Error(`nothing answers '${r.callback}' during ${labelAt(label, null)}`);
          answer = { callback_reply: callback(r) ?? null };
        } catch (e) {
          answer = { callback_error: (e as Error).message ?? String(e) };
        }
        this.roundTrips.callbacks++;
        this.send(answer, false);
        continue;
      }
      if (r.id !== id) this.fail(`${this.what}: ${labelAt(label, null)}: reply ${r.id} for request ${id}`);
      if (r.ok) return r.value;
      const name = labelAt(label, r.at as number | null | undefined);
      // bridge.py's own checks say it all; the user's exceptions come with their traceback
      if (r.plain) throw new PythonCallError(`${name}: ${r.error}`, "error");
      throw new PythonCallError(`${name} raised: ${r.error}\n${r.traceback ?? ""}`.trimEnd(), "error", r.traceback);
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

  get(i: number): RLRow {
    return this.getMany([i])[0]!;
  }

  /** Rows in one round trip, each read by __getitem__ in order, as get(i) one by one would. */
  getMany(indices: number[]): RLRow[] {
    if (indices.length === 0) return [];
    const label = `data.custom_cls (${this.spec.label})`;
    const raw = this.bridge.call("get_many", { handle: this.handle, indices }, (at) => {
      const one = at !== null ? indices[at] : indices.length === 1 ? indices[0] : undefined;
      return one !== undefined ? `${label}: __getitem__(${one})` : `${label}: __getitem__ for the ${indices.length} rows of a batch (${indices.slice(0, 8).join(", ")}${indices.length > 8 ? ", ..." : ""})`;
    }) as unknown[];
    if (!Array.isArray(raw) || raw.length !== indices.length) throw new Error(`${label}: the bridge sent ${Array.isArray(raw) ? raw.length : "no"} rows for ${indices.length}`);
    return raw.map((r, k) => rowFromPython(r, this.cfg, this.tokenizer, this.opts.tools, `${label}: row ${indices[k]}`));
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
    this.rowsFor = (req) => {
      if (req.callback === "row") return dataset.get(req.index as number);
      if (req.callback === "rows") return rowsOf(dataset, req.indices as number[]);
      throw new Error(`unknown request '${req.callback}'`);
    };
    const label = `data.sampler (${spec.label})`;
    const own = dataset instanceof PythonDataset && dataset.bridge === bridge;
    const r = bridge.call("sampler", {
      handle: this.handle, path: spec.path, name: spec.name, config: data,
      dataset: own ? dataset.handle : null, rows: 0, length: dataset.length,
    }, `${label}: building it`, this.rowsFor) as { length: unknown; curriculum: boolean; stateful: boolean };
    if (r.length !== null) {
      if (!Number.isInteger(r.length) || (r.length as number) < 0) throw new Error(`${label}: len() must be a non-negative integer, got ${JSON.stringify(r.length)}`);
      this.length = r.length as number;
    }
    if (r.curriculum) {
      this.update = (batch) => {
        this.bridge.call("update", {
          handle: this.handle,
          batch: { size: batch.length, tensor_keys: Object.keys(batch.batch), non_tensor_keys: Object.keys(batch.nonTensorBatch), meta_info: batch.metaInfo },
        }, `${label}: update(batch)`, (req) => (req.callback === "field" ? batchField(batch, req) : this.rowsFor(req)));
      };
    }
    if (r.stateful) {
      this.stateDict = () => this.bridge.call("state_dict", { handle: this.handle }, `${label}: state_dict()`);
      this.loadStateDict = (state) => { this.bridge.call("load_state_dict", { handle: this.handle, state }, `${label}: load_state_dict()`); };
    }
  }

  /** Answers data_source[i] / data_source[a:b] of a sampler over verl-ts's own dataset. */
  private readonly rowsFor: Callback;

  /** A pass: iter(sampler) now, then `count` next() calls per take(count), in one round trip. */
  draws(): IndexDraws {
    const label = `data.sampler (${this.spec.label})`;
    this.bridge.call("iter", { handle: this.handle }, `${label}: iter()`, this.rowsFor);
    let drawn = 0;
    return {
      take: (count) => {
        if (count <= 0) return [];
        const got = this.bridge.call("next_many", { handle: this.handle, count }, (at) => `${label}: next index${at === null ? "" : ` (draw ${drawn + at + 1} of the pass)`}`, this.rowsFor);
        if (!Array.isArray(got) || got.length > count) throw new Error(`${label}: the bridge sent ${JSON.stringify(got)?.slice(0, 80)} for ${count} indices`);
        drawn += got.length;
        return got as number[];
      },
    };
  }

  *[Symbol.iterator](): Iterator<number> {
    const pass = this.draws();
    for (;;) {
      const [i] = pass.take(1);
      if (i === undefined) return;
      yield i;
    }
  }
}
