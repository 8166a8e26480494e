// Batches from a dataset with a checkpointable position, like torchdata's
// StatefulDataLoader over verl's RandomSampler. Each `for (const batch of loader)`
// runs one epoch; the epoch's order is a permutation seeded by (seed, epoch), so
// a state {epoch, position} is enough to resume at the very next sample.
import { DataProto } from "../protocol/data_proto.js";
import { Rng } from "../utils/rng.js";

export interface BatchSource<Row = Record<string, unknown>> {
  readonly length: number;
  get(i: number): Row;
  /** The rows of `indices`, in order, as get() one by one gives them: a batch at once (a source behind a process). */
  getMany?(indices: number[]): Row[];
  collate?(rows: Row[]): DataProto;
}

/** A batch's rows: getMany when the source has it. */
export function rowsOf<Row>(source: BatchSource<Row>, indices: number[]): Row[] {
  return source.getMany ? source.getMany(indices) : indices.map((i) => source.get(i));
}

/** One pass over a sampler: take(n) draws its next n indices, fewer only where the pass ends. */
export interface IndexDraws {
  take(n: number): number[];
}

/** A pass of the sampler: its draws() when it has one, else its iterator read one index at a time. */
function drawsOf(sampler: IndexSampler): IndexDraws {
  if (sampler.draws) return sampler.draws();
  const it = sampler[Symbol.iterator]();
  return {
    take: (n) => {
      const out: number[] = [];
      while (out.length < n) {
        const r = it.next();
        if (r.done) break;
        out.push(r.value);
      }
      return out;
    },
  };
}

/**
 * data.sampler: a user's sampler (verl's AbstractSampler): an iterable of row indices, read afresh
 * each epoch and lazily, one batch at a time, so a curriculum sampler's update() after a step can
 * change the batches that follow (verl requires dataloader_num_workers=0 for the same reason).
 */
export interface IndexSampler {
  [Symbol.iterator](): Iterator<number>;
  /** Samples per epoch (default: the dataset's length). */
  readonly length?: number;
  /** Curriculum samplers (verl's AbstractCurriculumSampler.update): called with each trained batch. */
  update?(batch: DataProto): unknown;
  stateDict?(): unknown;
  loadStateDict?(state: unknown): void;
  /** A fresh pass drawn n indices at a time, the same indices its iterator yields (a sampler behind a process: one call a batch). */
  draws?(): IndexDraws;
}

export interface DataLoaderOptions<Row> {
  batchSize: number;
  /** Indices come from this sampler instead of the seeded shuffle; `label` names it in errors. */
  sampler?: { sampler: IndexSampler; label: string };
  shuffle?: boolean;
  seed?: number;
  dropLast?: boolean;
  /** Rows -> DataProto; defaults to the dataset's collate, else rows as non-tensor columns. */
  collate?: (rows: Row[]) => DataProto;
}

export interface DataLoaderState {
  epoch: number;
  /** Samples of this epoch already handed out. */
  position: number;
  seed: number;
  shuffle: boolean;
  datasetLength: number;
  /** The user's sampler's own stateDict(), when it has one. */
  sampler?: unknown;
}

function rowsAsColumns<Row>(rows: Row[]): DataProto {
  const cols: Record<string, unknown[]> = {};
  rows.forEach((r, i) => {
    for (const [k, v] of Object.entries(r as Record<string, unknown>)) (cols[k] ??= new Array(rows.length).fill(null))[i] = v;
  });
  return new DataProto({}, cols);
}

export class StatefulDataLoader<Row = Record<string, unknown>> implements Iterable<DataProto> {
  readonly batchSize: number;
  readonly shuffle: boolean;
  readonly seed: number;
  readonly dropLast: boolean;
  private epoch = 0;
  private position = 0;
  private readonly collateFn: (rows: Row[]) => DataProto;
  private readonly sampler: { sampler: IndexSampler; label: string } | undefined;

  constructor(readonly dataset: BatchSource<Row>, opts: DataLoaderOptions<Row>) {
    if (!Number.isInteger(opts.batchSize) || opts.batchSize < 1) throw new Error(`dataloader: batch size must be a positive integer, got ${opts.batchSize}`);
    this.batchSize = opts.batchSize;
    this.shuffle = opts.shuffle ?? true;
    this.seed = opts.seed ?? 1;
    this.dropLast = opts.dropLast ?? false;
    this.collateFn = opts.collate ?? (dataset.collate ? (rows) => dataset.collate!(rows) : rowsAsColumns);
    this.sampler = opts.sampler;
    if (this.sampler && typeof this.sampler.sampler[Symbol.iterator] !== "function") throw new Error(`${this.sampler.label}: a sampler must be iterable (yield row indices)`);
  }

  /** Samples per epoch: the sampler's length when it has one, else the dataset's. */
  private get epochSamples(): number {
    const n = this.sampler?.sampler.length;
    if (n === undefined) return this.dataset.length;
    if (!Number.isInteger(n) || n < 0) throw new Error(`${this.sampler!.label}: length must be a non-negative integer, got ${JSON.stringify(n)}`);
    return n;
  }

  /** Batches per epoch. */
  get length(): number {
    const n = this.epochSamples;
    return this.dropLast ? Math.floor(n / this.batchSize) : Math.ceil(n / this.batchSize);
  }

  get currentEpoch(): number {
    return this.epoch;
  }

  /** The sample order of an epoch. */
  order(epoch: number): number[] {
    const n = this.dataset.length;
    if (!this.shuffle) return [...Array(n).keys()];
    return new Rng((this.seed ^ Math.imul(epoch + 1, 0x9e3779b1)) >>> 0).permutation(n);
  }

  private epochEnd(): number {
    return this.dropLast ? this.length * this.batchSize : this.epochSamples;
  }

  /** One epoch from the user's sampler: indices pulled a batch at a time, checked, `position` skipped on resume. */
  /** loadStateDict gave the sampler its own state back: the next pass must not skip samples again. */
  private samplerRestored = false;

  private *fromSampler(): Generator<DataProto> {
    const { sampler, label } = this.sampler!;
    const epoch = this.epoch, end = this.epochEnd(), n = this.dataset.length;
    const pass = drawsOf(sampler);
    // a batch's indices are drawn only when the batch is due: a curriculum sampler's update() after
    // the previous step must steer them, as in verl's DataLoader (num_workers=0, no prefetch)
    const take = (count: number): number[] => {
      const got = pass.take(count);
      for (const i of got) if (!Number.isInteger(i) || i < 0 || i >= n) throw new Error(`${label}: yielded ${JSON.stringify(i)}, not a row index of the dataset's ${n} rows`);
      return got;
    };
    // resume: a sampler whose own state came back continues from it; any other replays the epoch
    // from a fresh iterator with the samples already trained on skipped (torchdata's rule)
    if (!this.samplerRestored && this.position > 0) take(this.position);
    this.samplerRestored = false;
    while (this.epoch === epoch && this.position < end) {
      const idx = take(Math.min(this.batchSize, end - this.position));
      if (idx.length === 0 || (this.dropLast && idx.length < this.batchSize)) break;
      this.position += idx.length;
      yield this.collateFn(rowsOf(this.dataset, idx));
    }
    if (this.epoch === epoch) { this.epoch++; this.position = 0; }
  }

  /** Hands a trained batch to a curriculum sampler (verl calls sampler.update(batch) after each step). */
  async updateSampler(batch: DataProto): Promise<void> {
    const s = this.sampler;
    if (!s || typeof s.sampler.update !== "function") return;
    try {
      await s.sampler.update(batch);
    } catch (e) {
      const msg = (e as Error).message ?? String(e);
      if (msg.startsWith(s.label)) throw e; // a Python sampler's error names the class already
      throw new Error(`${s.label}: update(batch) failed: ${msg}`);
    }
  }

  *[Symbol.iterator](): Iterator<DataProto> {
    if (this.sampler) {
      if (this.position >= this.epochEnd() && this.position > 0) { this.epoch++; this.position = 0; }
      yield* this.fromSampler();
      return;
    }
    // A state saved after an epoch's last batch resumes with the next epoch.
    if (this.position >= this.epochEnd() && this.position > 0) { this.epoch++; this.position = 0; }
    const epoch = this.epoch;
    const order = this.order(epoch);
    const end = this.epochEnd();
    while (this.epoch === epoch && this.position < end) {
      const idx = order.slice(this.position, Math.min(this.position + this.batchSize, end));
      this.position += idx.length;
      yield this.collateFn(rowsOf(this.dataset, idx));
    }
    if (this.epoch === epoch && this.position >= end) { this.epoch++; this.position = 0; }
  }

  stateDict(): DataLoaderState {
    const st: DataLoaderState = { epoch: this.epoch, position: this.position, seed: this.seed, shuffle: this.shuffle, datasetLength: this.dataset.length };
    const own = this.sampler?.sampler.stateDict?.();
    if (own !== undefined) st.sampler = own;
    return st;
  }

  loadStateDict(s: DataLoaderState): void {
    const bad = (why: string) => new Error(`dataloader state: ${why}`);
    if (s === null || typeof s !== "object") throw bad("not an object");
    for (const k of ["epoch", "position", "datasetLength"] as const) {
      if (!Number.isInteger(s[k]) || s[k] < 0) throw bad(`'${k}' must be a non-negative integer, got ${JSON.stringify(s[k])}`);
    }
    if (s.datasetLength !== this.dataset.length) {
      throw bad(`saved for a dataset of ${s.datasetLength} rows, but this dataset has ${this.dataset.length}; resuming would pick other samples`);
    }
    if (s.seed !== this.seed || s.shuffle !== this.shuffle) {
      throw bad(`saved with seed=${s.seed} shuffle=${s.shuffle}, but this loader has seed=${this.seed} shuffle=${this.shuffle}`);
    }
    if (s.position > Math.max(this.dataset.length, this.epochSamples)) throw bad(`position ${s.position} is past the epoch's ${this.epochSamples} samples`);
    this.samplerRestored = false;
    if (this.sampler && s.sampler !== undefined && typeof this.sampler.sampler.loadStateDict === "function") {
      this.sampler.sampler.loadStateDict(s.sampler);
      this.samplerRestored = true;
    }
    this.epoch = s.epoch;
    this.position = s.position;
  }
}
