// The train and validation loaders a PPO run needs, built from the `data` config
// section as verl's RayPPOTrainer._create_dataloader builds them.
import type { Tokenizer } from "../models/tokenizer.js";
import { UserDataset, type CustomDatasetClass, type SamplerClass } from "./custom_dataset.js";
import { StatefulDataLoader, type BatchSource, type IndexSampler } from "./dataloader.js";
import { RLHFDataset, type RLRow, type RLHFDatasetOptions } from "./rl_dataset.js";
import { dataFiles, readDataConfig } from "./data_config.js";

export interface RLDataloaders {
  trainDataset: BatchSource<RLRow>;
  valDataset: BatchSource<RLRow>;
  train: StatefulDataLoader<RLRow>;
  val: StatefulDataLoader<RLRow>;
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
  opts: Pick<RLHFDatasetOptions, "tools"> & { datasetClass?: CustomDatasetClass | null; samplerClass?: { cls: SamplerClass; label: string } | null } = {},
): RLDataloaders {
  const cfg = readDataConfig(data);
  const { datasetClass, samplerClass, ...dsOpts } = opts;
  const dataset = (split: "train" | "val"): BatchSource<RLRow> => {
    const files = dataFiles(data[`${split}_files`], `${split}_files`);
    const max = maxSamples(data[`${split}_max_samples`], `${split}_max_samples`);
    try {
      // data.custom_cls: the user's class in RLHFDataset's place (loaded by loadCustomDatasetClass)
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
      sampler = { sampler: new samplerClass.cls(trainDataset, data), label: samplerClass.label };
    } catch (e) {
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
  return { trainDataset, valDataset, train, val };
}
