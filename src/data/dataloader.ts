// Batches from a dataset with a checkpointable position, like torchdata's
// StatefulDataLoader over verl's RandomSampler. Each `for (const batch of loader)`
// runs one epoch; the epoch's order is a permutation seeded by (seed, epoch), so
// a state {epoch, position} is enough to resume at the very next sample.
import { DataProto } from "../protocol/data_proto.js";
import { Rng } from "../utils/rng.js";

export interface BatchSource<Row = Record<string, unknown>> {
  readonly length: number;
  get(i: number): Row;
  collate?(rows: Row[]): DataProto;
}

export interface DataLoaderOptions<Row> {
  batchSize: number;
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

  constructor(readonly dataset: BatchSource<Row>, opts: DataLoaderOptions<Row>) {
    if (!Number.isInteger(opts.batchSize) || opts.batchSize < 1) throw new Error(`dataloader: batch size must be a positive integer, got ${opts.batchSize}`);
    this.batchSize = opts.batchSize;
    this.shuffle = opts.shuffle ?? true;
    this.seed = opts.seed ?? 1;
    this.dropLast = opts.dropLast ?? false;
    this.collateFn = opts.collate ?? (dataset.collate ? (rows) => dataset.collate!(rows) : rowsAsColumns);
  }

  /** Batches per epoch. */
  get length(): number {
    const n = this.dataset.length;
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
    return this.dropLast ? this.length * this.batchSize : this.dataset.length;
  }

  *[Symbol.iterator](): Iterator<DataProto> {
    // A state saved after an epoch's last batch resumes with the next epoch.
    if (this.position >= this.epochEnd() && this.position > 0) { this.epoch++; this.position = 0; }
    const epoch = this.epoch;
    const order = this.order(epoch);
    const end = this.epochEnd();
    while (this.epoch === epoch && this.position < end) {
      const idx = order.slice(this.position, Math.min(this.position + this.batchSize, end));
      this.position += idx.length;
      yield this.collateFn(idx.map((i) => this.dataset.get(i)));
    }
    if (this.epoch === epoch && this.position >= end) { this.epoch++; this.position = 0; }
  }

  stateDict(): DataLoaderState {
    return { epoch: this.epoch, position: this.position, seed: this.seed, shuffle: this.shuffle, datasetLength: this.dataset.length };
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
    if (s.position > this.dataset.length) throw bad(`position ${s.position} is past the dataset's ${this.dataset.length} rows`);
    this.epoch = s.epoch;
    this.position = s.position;
  }
}
