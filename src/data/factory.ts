// The train and validation loaders a PPO run needs, built from the `data` config
// section as verl's RayPPOTrainer._create_dataloader builds them.
import type { Tokenizer } from "../models/tokenizer.js";
import { UserDataset, type CustomDatasetClass, type SamplerSpec } from "./custom_dataset.js";
import { PythonBridge, PythonDataset, PythonSampler } from "./python_bridge.js";
import { StatefulDataLoader, type BatchSource, type IndexSampler } from "./dataloader.js";
import { RLHFDataset, type RLRow, type RLHFDatasetOptions } from "./rl_dataset.js";
import { dataFiles, readDataConfig } from "./data_config.js";

export interface RLDataloaders {
  trainDataset: BatchSource<RLRow>;
  valDataset: BatchSource<RLRow>;
  train: StatefulDataLoader<RLRow>;
  val: StatefulDataLoader<RLRow>;
  /** The python3 process that Python data classes run in, or null. */
  pythonBridge: PythonBridge | null;
  /** Ends the python3 process that Python data classes run in (a no-op without one). */
  close(): void;
}

/** data.python_timeout_s: seconds each call into a Python data class may take. */
function pythonTimeoutMs(v: unknown): number {
  if (v === undefined || v === null) return 300_000;
  if (typeof v !== "number" || !(v > 0)) throw new Error(`data.python_timeout_s must be a positive number of seconds, got ${JSON.stringify(v)}`);
  return v * 1000;
}

/** verl builds a data.sampler only with data.dataloader_num_workers=0 (prefetching workers would read batches before update()). */
function checkSamplerWorkers(data: Record<string, unknown>, label: string): void {
  const w = data.dataloader_num_workers ?? 8;
  if (w !== 0) throw new Error(`${label}: a data.sampler needs data.dataloader_num_workers=0, as verl requires (workers would prefetch batches before the sampler's update()); got ${JSON.stringify(w)}`);
}

function positiveOr(v: unknown, key: string, fallback: number): number {
  if (v === undefined || v === null) return fallback;
  if (!Number.isInteger(v) || (v as number) < 1) throw new Error(`data.${key} must be a positive integer, got ${JSON.stringify(v)}`);
  return v as number;
}

/** data.{train,val}_max_samples, checked (-1 = all rows). */
export function maxSamples(v: unknown, key: string): number {
  if (v === undefined || v === null) return -1;
  if (!Number.isInteger(v)) throw new Error(`data.${key} must be an integer (-1 = all), got ${JSON.stringify(v)}`);
  return v as number;
}

/** Train loader: gen_batch_size (else train_batch_size) prompts, drop_last, seeded shuffle.
 *  Val loader: val_batch_size (null = the whole set), validation_shuffle, keeps the last batch. */
export function createRLDataloaders(
  data: Record<string, unknown>, tokenizer: Tokenizer | null,
  opts: Pick<RLHFDatasetOptions, "tools"> & {
    datasetClass?: CustomDatasetClass | null; samplerClass?: SamplerSpec | null;
    /** For a Python dataset class: the Hugging Face tokenizer it is built with (actor_rollout_ref.model.path, data.trust_remote_code). */
    hfTokenizer?: { path: string | null; trustRemoteCode: boolean };
  } = {},
): RLDataloaders {
  const cfg = readDataConfig(data);
  const { datasetClass, samplerClass, hfTokenizer, ...dsOpts } = opts;
  if (samplerClass) checkSamplerWorkers(data, samplerClass.label);
  const pyKeys = [datasetClass?.python && `data.custom_cls.path=${datasetClass.python.path}`, samplerClass?.python && `data.sampler.class_path=${samplerClass.python.path}`].filter(Boolean);
  const bridge = pyKeys.length > 0 ? new PythonBridge(pyKeys.join(" and "), pythonTimeoutMs(data.python_timeout_s)) : null;
  try {
    return build();
  } catch (e) {
    bridge?.close();
    throw e;
  }

  function build(): RLDataloaders {
    const dataset = (split: "train" | "val"): BatchSource<RLRow> => {
      const files = dataFiles(data[`${split}_files`], `${split}_files`);
      const max = maxSamples(data[`${split}_max_samples`], `${split}_max_samples`);
      try {
        // data.custom_cls: the user's class in RLHFDataset's place (loaded by loadCustomDatasetClass)
        if (datasetClass?.python) {
          return new PythonDataset(bridge!, datasetClass.python, files, tokenizer, data, {
            ...dsOpts, maxSamples: max, tokenizerPath: hfTokenizer?.path ?? null, trustRemoteCode: hfTokenizer?.trustRemoteCode ?? false,
          });
        }
        if (datasetClass) return new UserDataset(datasetClass, files, tokenizer, data, { ...dsOpts, maxSamples: max });
        return new RLHFDataset(files, tokenizer, data, { ...dsOpts, maxSamples: max });
      } catch (e) {
        throw new Error(`data.${split}_files: ${(e as Error).message}`);
      }
    };
    const trainDataset = dataset("train");
    const valDataset = dataset("val");
    const trainBatch = positiveOr(data.gen_batch_size, "gen_batch_size", positiveOr(data.train_batch_size, "train_batch_size", 1024));
    // data.sampler (verl's create_rl_sampler): the user's sampler orders the train set instead of the seeded shuffle
    let sampler: { sampler: IndexSampler; label: string } | undefined;
    if (samplerClass) {
      try {
        if (samplerClass.python) sampler = { sampler: new PythonSampler(bridge!, samplerClass.python, trainDataset, data), label: samplerClass.label };
        else sampler = { sampler: new samplerClass.cls!(trainDataset, data), label: samplerClass.label };
      } catch (e) {
        if (samplerClass.python) throw e; // the bridge's errors name the class and the call
        throw new Error(`${samplerClass.label}: the constructor failed: ${(e as Error).message ?? String(e)}`);
      }
    }
    const train = new StatefulDataLoader<RLRow>(trainDataset, { batchSize: trainBatch, shuffle: cfg.shuffle, seed: cfg.seed, dropLast: true, sampler });
    if (train.length < 1) {
      throw new Error(`the train dataloader is empty: ${trainDataset.length} prompts, fewer than one batch of ${trainBatch} (data.train_batch_size)`);
    }
    const valShuffle = typeof data.validation_shuffle === "boolean" ? data.validation_shuffle : false;
    const val = new StatefulDataLoader<RLRow>(valDataset, {
      batchSize: positiveOr(data.val_batch_size, "val_batch_size", Math.max(1, valDataset.length)), shuffle: valShuffle, seed: cfg.seed, dropLast: false,
    });
    if (val.length < 1) throw new Error("the validation dataloader is empty (data.val_files has no rows)");
    return { trainDataset, valDataset, train, val, pythonBridge: bridge, close: () => bridge?.close() };
  }
}
