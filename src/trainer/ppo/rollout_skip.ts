// rollout.skip_rollout (verl's RolloutSkip): the first training rollout is written to one file
// under rollout.skip_dump_dir; from then on, in this run and any later run whose file name
// matches, every training step loads that batch instead of generating.
//
// As verl: one file per {experiment_name}_{project_name}_GBS{gen batch}__N{n} (verl documents
// the trainer's names; its code reads them from data.*, where they do not exist, so verl's own
// files all start with `__GBS`), reused for every step. Unlike verl the file holds the step's
// whole rollout (the prompts' columns with their ground truth and uids, the generation input,
// the generated batch), so a replayed step is scored against its own prompts; verl's wrapper
// replaced only the generated half. A file that cannot be read or does not fit the current
// batch stops the run, naming the file, instead of being silently regenerated.
//
// File layout: the frame of src/single_controller/distributed/wire.ts (u32 skeleton length,
// v8-serialized skeleton, then each tensor's raw little-endian bytes, 8-byte aligned); the
// head is {format: "verl-ts rollout dump", version: 1}, the value {prompts, gen, out}, each a
// DataProto as {batch: {key: {data, shape, dtype}}, nonTensorBatch, metaInfo}. verl's pickles
// hold torch tensors and cannot be read here, nor ours by verl.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { expandHome } from "../../data/home_path.js";
import { writeFileAtomic } from "../../utils/fs.js";
import { DataProto } from "../../protocol/index.js";
import { decodeFrame, encodeFrame } from "../../single_controller/distributed/wire.js";
import { logger } from "../../utils/logger.js";
import type { ConfigView } from "../../workers/config_view.js";

export const ROLLOUT_DUMP_FORMAT = "verl-ts rollout dump";
const VERSION = 1;

/** One training step's rollout: the prompts' other columns, the generation input, its output. */
export interface RolloutRecord {
  prompts: DataProto;
  gen: DataProto;
  out: DataProto;
}

interface ProtoPlain {
  batch: DataProto["batch"];
  nonTensorBatch: DataProto["nonTensorBatch"];
  metaInfo: DataProto["metaInfo"];
}

const plain = (p: DataProto): ProtoPlain => ({ batch: p.batch, nonTensorBatch: p.nonTensorBatch, metaInfo: p.metaInfo });

function proto(v: unknown, file: string, what: string): DataProto {
  const p = v as Partial<ProtoPlain> | null;
  if (!p || typeof p.batch !== "object" || typeof p.nonTensorBatch !== "object" || typeof p.metaInfo !== "object") {
    throw new Error(`rollout dump ${file}: '${what}' is not a DataProto`);
  }
  return new DataProto(p.batch, p.nonTensorBatch, p.metaInfo);
}

export function writeRolloutDump(file: string, rec: RolloutRecord): void {
  // atomic: a run killed mid-write leaves no half file for the next run to load
  writeFileAtomic(file, encodeFrame({ format: ROLLOUT_DUMP_FORMAT, version: VERSION }, { prompts: plain(rec.prompts), gen: plain(rec.gen), out: plain(rec.out) }));
}

export function readRolloutDump(file: string): RolloutRecord {
  let frame;
  try {
    frame = decodeFrame<{ format?: unknown; version?: unknown }>(readFileSync(file));
  } catch (e) {
    throw new Error(`rollout dump ${file} cannot be read (${(e as Error).message}); delete it or set actor_rollout_ref.rollout.skip_dump_dir elsewhere`);
  }
  if (frame.head.format !== ROLLOUT_DUMP_FORMAT) throw new Error(`rollout dump ${file} is not a verl-ts rollout dump (verl's pickled dumps cannot be read here)`);
  if (frame.head.version !== VERSION) throw new Error(`rollout dump ${file} has version ${String(frame.head.version)}; this build reads version ${VERSION}`);
  const v = frame.value as Record<string, unknown>;
  return { prompts: proto(v.prompts, file, "prompts"), gen: proto(v.gen, file, "gen"), out: proto(v.out, file, "out") };
}

export class RolloutSkip {
  readonly file: string;
  private cached: RolloutRecord | null = null;

  constructor(readonly dir: string, experiment: string, project: string, genBatchSize: number, n: number) {
    this.file = join(dir, `${experiment}_${project}_GBS${genBatchSize}__N${n}`);
  }

  /** From the config, or null when rollout.skip_rollout is off. */
  static fromConfig(cfg: ConfigView): RolloutSkip | null {
    if (!cfg.bool("actor_rollout_ref.rollout.skip_rollout", false)) return null;
    const dir = cfg.optStr("actor_rollout_ref.rollout.skip_dump_dir");
    if (!dir) throw new Error("actor_rollout_ref.rollout.skip_rollout=True needs actor_rollout_ref.rollout.skip_dump_dir (a folder)");
    const gbs = cfg.optInt("data.gen_batch_size") ?? cfg.int("data.train_batch_size");
    const skip = new RolloutSkip(expandHome(dir), cfg.optStr("trainer.experiment_name") ?? "", cfg.optStr("trainer.project_name") ?? "",
      gbs, cfg.int("actor_rollout_ref.rollout.n", 1));
    logger().info({ file: skip.file }, existsSync(skip.file)
      ? "rollout.skip_rollout: training steps load the rollout dumped in this file"
      : "rollout.skip_rollout: no dump yet; the first training rollout is generated and written to this file, later steps load it");
    return skip;
  }

  /**
   * The step's rollout: the dump when there is one (checked against the current batch's shape),
   * else `generate()`'s, written to the file first.
   */
  async rollout(current: RolloutRecord, generate: () => Promise<DataProto>): Promise<RolloutRecord & { loaded: boolean }> {
    if (!this.cached && existsSync(this.file)) {
      this.cached = readRolloutDump(this.file);
      this.check(this.cached, current);
    }
    if (this.cached) return { ...copyRecord(this.cached), loaded: true };
    // copied first: handing the batch to the workers may move its buffers
    const before = { prompts: current.prompts.clone(), gen: current.gen.clone() };
    const out = await generate();
    const rec = { ...before, out };
    writeRolloutDump(this.file, rec);
    logger().info({ file: this.file, rows: out.length }, "rollout.skip_rollout: rollout dumped");
    // later steps train on copies of what was written
    this.cached = { ...before, out: out.clone() };
    return { prompts: current.prompts, gen: current.gen, out, loaded: false };
  }

  /** A dump from another shape of run (prompt length, batch size) must not be trained on. */
  private check(rec: RolloutRecord, current: RolloutRecord): void {
    const bad = (what: string) => new Error(
      `rollout dump ${this.file} does not fit this run: ${what}; delete it or set actor_rollout_ref.rollout.skip_dump_dir elsewhere`,
    );
    if (rec.prompts.length !== current.prompts.length) throw bad(`it holds ${rec.prompts.length} prompts, the step has ${current.prompts.length}`);
    if (rec.gen.length !== current.gen.length || rec.out.length !== current.gen.length) {
      throw bad(`it holds ${rec.out.length} sequences, the step generates ${current.gen.length}`);
    }
    for (const key of Object.keys(current.gen.batch)) {
      const want = current.gen.batch[key]!.shape, got = rec.gen.batch[key]?.shape;
      if (!got || got.join(",") !== want.join(",")) throw bad(`its '${key}' has shape [${got?.join(", ") ?? "none"}], this run's [${want.join(", ")}]`);
    }
  }
}

/** Fresh arrays each step: the trainer and the workers' transfers may move or change them. */
function copyRecord(r: RolloutRecord): RolloutRecord {
  return { prompts: r.prompts.clone(), gen: r.gen.clone(), out: r.out.clone() };
}
