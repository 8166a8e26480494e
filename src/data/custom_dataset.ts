// data.custom_cls.{path,name}: the user's dataset class, in the role of a verl RLHFDataset subclass
// (verl's get_dataset_class). A JS or TypeScript class is constructed as RLHFDataset is,
// `new Cls(dataFiles, tokenizer, dataConfig, {maxSamples, tools})`, once for the train files and
// once for the validation files, so extending verl-ts's RLHFDataset and overriding get() (or the
// constructor) is the usual way. An instance needs `length` and `get(i)` (a row: raw_prompt,
// input_ids when there is a tokenizer, reward_model, ...); `collate(rows)` is optional
// (RLHFDataset's padding otherwise). A Python class (a .py path or pkg://module) is verl's own kind
// and runs in python3 through src/data/python_bridge.ts; data.sampler likewise.
import { existsSync } from "node:fs";
import type { Tokenizer } from "../models/tokenizer.js";
import type { DataProto } from "../protocol/data_proto.js";
import { loadExport } from "../reward/custom.js";
import { isPythonModule } from "../reward/python_reward.js";
import type { PythonClassSpec } from "./python_bridge.js";
import { collateToDataProto } from "./collate.js";
import { readDataConfig } from "./data_config.js";
import type { BatchSource, IndexSampler } from "./dataloader.js";
import type { RLHFDatasetOptions, RLRow } from "./rl_dataset.js";

export type RLDatasetClass = new (files: string[], tokenizer: Tokenizer | null, dataConfig: Record<string, unknown>, opts: RLHFDatasetOptions) => unknown;

export interface CustomDatasetClass {
  /** A JS/TS class; unset for a Python one. */
  cls?: RLDatasetClass;
  /** A Python class, run by the bridge. */
  python?: PythonClassSpec;
  /** `MyDataset from /abs/my_data.mjs`, for errors. */
  label: string;
}

interface UserInstance {
  length: unknown;
  get: (i: number) => unknown;
  collate?: (rows: RLRow[]) => unknown;
}

/**
 * A class a data key names (`data.custom_cls.{path,name}`, `data.sampler.{class_path,class_name}`),
 * or null when the path is unset. A Python class is only named here: the bridge imports it when
 * the dataloaders are built.
 */
async function loadDataClass(key: string, pathKey: string, nameKey: string, spec: unknown): Promise<{ cls?: new (...args: never[]) => unknown; python?: PythonClassSpec; label: string } | null> {
  if (spec === undefined || spec === null) return null;
  if (typeof spec !== "object" || Array.isArray(spec)) throw new Error(`${key} must be a mapping {${pathKey}, ${nameKey}}, got ${JSON.stringify(spec)}`);
  const { [pathKey]: path, [nameKey]: name } = spec as Record<string, unknown>;
  if (path === undefined || path === null) return null;
  if (typeof path !== "string" || path === "") throw new Error(`${key}.${pathKey} must be a file path, got ${JSON.stringify(path)}`);
  if (typeof name !== "string" || name === "") throw new Error(`${key}.${nameKey} must name the class exported by ${path}, got ${JSON.stringify(name)}`);
  if (isPythonModule(path)) {
    if (!path.startsWith("pkg://") && !existsSync(path)) throw new Error(`${key}.${pathKey}=${path}: no such file`);
    const label = `${name} from ${path}`;
    return { python: { path, name, label }, label };
  }
  const cls = await loadExport(path, name, `${key} module`, `${key}.${pathKey}`);
  if (typeof cls !== "function") throw new Error(`${key}: export '${name}' of ${path} is a ${typeof cls}, not a class`);
  return { cls: cls as new (...args: never[]) => unknown, label: `${name} from ${path}` };
}

/** The class data.custom_cls names, or null when data.custom_cls.path is unset. */
export async function loadCustomDatasetClass(data: Record<string, unknown>): Promise<CustomDatasetClass | null> {
  const c = await loadDataClass("data.custom_cls", "path", "name", data.custom_cls);
  return c && { ...c, cls: c.cls as unknown as RLDatasetClass | undefined };
}

export type SamplerClass = new (dataSource: BatchSource<RLRow>, dataConfig: Record<string, unknown>) => IndexSampler;

export interface SamplerSpec {
  /** A JS/TS class; unset for a Python one. */
  cls?: SamplerClass;
  python?: PythonClassSpec;
  /** `data.sampler (Name from /abs/file)`, for errors. */
  label: string;
}

/** The class data.sampler names (verl's AbstractSampler / AbstractCurriculumSampler), or null. */
export async function loadSamplerClass(data: Record<string, unknown>): Promise<SamplerSpec | null> {
  const c = await loadDataClass("data.sampler", "class_path", "class_name", data.sampler);
  return c && { ...c, cls: c.cls as unknown as SamplerClass | undefined, label: `data.sampler (${c.label})` };
}

/** The user's dataset behind the loader's interface: its calls are checked and its errors name the class. */
export class UserDataset implements BatchSource<RLRow> {
  private readonly inner: UserInstance;
  private readonly pad: number;
  private readonly config: ReturnType<typeof readDataConfig>;

  constructor(readonly spec: CustomDatasetClass, files: string[], tokenizer: Tokenizer | null, data: Record<string, unknown>, opts: RLHFDatasetOptions) {
    let inst: unknown;
    try {
      if (!spec.cls) throw new Error("not a JS/TS class");
      inst = new spec.cls(files, tokenizer, data, opts);
    } catch (e) {
      throw new Error(`data.custom_cls (${spec.label}): the constructor failed: ${(e as Error).message ?? String(e)}`);
    }
    const u = inst as UserInstance;
    if (inst === null || typeof inst !== "object" || typeof u.get !== "function") throw new Error(`data.custom_cls (${spec.label}): an instance needs a get(index) method`);
    if (u.collate !== undefined && typeof u.collate !== "function") throw new Error(`data.custom_cls (${spec.label}): collate must be a method`);
    this.inner = u;
    this.config = readDataConfig(data);
    this.pad = tokenizer?.padTokenId ?? 0;
    void this.length; // checked now, not at the first batch
  }

  get length(): number {
    const n = this.inner.length;
    if (typeof n !== "number" || !Number.isInteger(n) || n < 0) throw new Error(`data.custom_cls (${this.spec.label}): length must be a non-negative integer, got ${JSON.stringify(n)}`);
    return n;
  }

  get(i: number): RLRow {
    let row: unknown;
    try {
      row = this.inner.get(i);
    } catch (e) {
      throw new Error(`data.custom_cls (${this.spec.label}): get(${i}) failed: ${(e as Error).message ?? String(e)}`);
    }
    if (row === null || typeof row !== "object" || Array.isArray(row) || row instanceof Promise) {
      throw new Error(`data.custom_cls (${this.spec.label}): get(${i}) must return a row object (synchronously), got ${row instanceof Promise ? "a Promise" : JSON.stringify(row)}`);
    }
    return row as RLRow;
  }

  collate(rows: RLRow[]): DataProto {
    try {
      if (this.inner.collate) {
        const out = this.inner.collate(rows) as DataProto | null;
        if (!out || typeof out.batch !== "object" || typeof out.nonTensorBatch !== "object") throw new Error("collate must return a DataProto");
        return out;
      }
      return collateToDataProto(rows, { maxPromptLength: this.config.maxPromptLength, padTokenId: this.pad, truncation: this.config.truncation });
    } catch (e) {
      throw new Error(`data.custom_cls (${this.spec.label}): collating a batch failed: ${(e as Error).message ?? String(e)}`);
    }
  }
}
