// Sequence-length balancing (verl seqlen_balancing, §3 step 6): Karmarkar-Karp
// (largest differencing) partitions so each data-parallel rank or micro-batch gets a
// similar workload. The heap follows Python's heapq exactly, so partitions match verl's.

/** Attention-dominated cost estimate of a sequence: 24576·L + L² (7B-model constants, as verl). */
export function calculateWorkload(seqLen: number): number {
  return 24576 * seqLen + seqLen * seqLen;
}

interface PartSet { sum: number; items: [number, number][] } // items: (index, value)

function cmpSet(a: PartSet, b: PartSet): number {
  if (a.sum !== b.sum) return a.sum - b.sum;
  if (a.items.length !== b.items.length) return a.items.length - b.items.length;
  for (let i = 0; i < a.items.length; i++) {
    const [ai, av] = a.items[i]!, [bi, bv] = b.items[i]!;
    if (ai !== bi) return ai - bi;
    if (av !== bv) return av - bv;
  }
  return 0;
}

class State {
  sets: PartSet[];
  constructor(items: [number, number][], readonly k: number) {
    this.sets = Array.from({ length: k }, () => ({ sum: 0, items: [] }));
    items.forEach(([idx, val], i) => {
      this.sets[i]!.items.push([idx, val]);
      this.sets[i]!.sum += val;
    });
    this.sortSets();
  }
  private sortSets(): void {
    this.sets.sort((a, b) => cmpSet(b, a)); // stable, descending
  }
  merge(other: State): void {
    for (let i = 0; i < this.k; i++) {
      const into = this.sets[i]!, from = other.sets[this.k - 1 - i]!;
      for (const it of from.items) into.items.push(it);
      into.sum += from.sum;
    }
    this.sortSets();
  }
  get spread(): number {
    return this.sets[0]!.sum - this.sets[this.sets.length - 1]!.sum;
  }
  /** heapq order: the largest spread pops first, then the one with the largest top set. */
  lessThan(other: State): boolean {
    if (this.spread !== other.spread) return this.spread > other.spread;
    return cmpSet(this.sets[0]!, other.sets[0]!) > 0;
  }
}

// Python's heapq push/pop, so ties resolve as in verl.
function siftDown(heap: State[], start: number, pos: number): void {
  const item = heap[pos]!;
  while (pos > start) {
    const parentPos = (pos - 1) >> 1;
    const parent = heap[parentPos]!;
    if (!item.lessThan(parent)) break;
    heap[pos] = parent;
    pos = parentPos;
  }
  heap[pos] = item;
}

function heapPush(heap: State[], item: State): void {
  heap.push(item);
  siftDown(heap, 0, heap.length - 1);
}

function heapPop(heap: State[]): State {
  const last = heap.pop()!;
  if (heap.length === 0) return last;
  const top = heap[0]!;
  heap[0] = last;
  const end = heap.length, start = 0;
  let pos = 0, child = 1;
  while (child < end) {
    const right = child + 1;
    if (right < end && !heap[child]!.lessThan(heap[right]!)) child = right;
    heap[pos] = heap[child]!;
    pos = child;
    child = 2 * pos + 1;
  }
  heap[pos] = last;
  siftDown(heap, start, pos);
  return top;
}

/** Largest differencing method into k partitions (each an index list, unsorted). */
export function karmarkarKarp(seqLens: readonly number[], k: number, equalSize: boolean): number[][] {
  const sorted = seqLens.map((v, i) => [v, i] as [number, number]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const heap: State[] = [];
  if (equalSize) {
    if (seqLens.length % k !== 0) throw new Error(`equal-size balancing needs the item count (${seqLens.length}) divisible by ${k}`);
    for (let off = 0; off < sorted.length; off += k) {
      heapPush(heap, new State(sorted.slice(off, off + k).map(([v, i]) => [i, v]), k));
    }
  } else {
    for (const [v, i] of sorted) heapPush(heap, new State([[i, v]], k));
  }
  while (heap.length > 1) {
    const a = heapPop(heap), b = heapPop(heap);
    a.merge(b);
    heapPush(heap, a);
  }
  return heap[0]!.sets.map((s) => s.items.map(([i]) => i));
}

/** k balanced partitions of the indices of `seqLens` (each sorted ascending, none empty). */
export function getSeqlenBalancedPartitions(seqLens: readonly number[], k: number, equalSize: boolean): number[][] {
  if (!Number.isInteger(k) || k < 1) throw new Error(`number of partitions must be a positive integer, got ${k}`);
  if (seqLens.length < k) throw new Error(`cannot split ${seqLens.length} items into ${k} non-empty partitions`);
  const parts = karmarkarKarp(seqLens, k, equalSize).map((p) => [...p].sort((a, b) => a - b));
  parts.forEach((p, i) => {
    if (p.length === 0) throw new Error(`balancing left partition ${i} empty`);
  });
  return parts;
}

/** global_seqlen-style metrics: contiguous chunks before, partitions after balancing. */
export function logSeqlenUnbalance(seqLens: readonly number[], partitions: readonly number[][], prefix: string): Record<string, number> {
  const k = partitions.length;
  const chunk = Math.floor(seqLens.length / k);
  let min = Infinity, max = -Infinity, total = 0;
  for (let off = 0; off < seqLens.length; off += chunk) {
    const s = seqLens.slice(off, off + chunk).reduce((a, b) => a + b, 0);
    min = Math.min(min, s);
    max = Math.max(max, s);
    total += s;
  }
  const balanced = partitions.map((p) => p.reduce((a, i) => a + seqLens[i]!, 0));
  return {
    [`${prefix}/min`]: min,
    [`${prefix}/max`]: max,
    [`${prefix}/minmax_diff`]: max - min,
    [`${prefix}/balanced_min`]: Math.min(...balanced),
    [`${prefix}/balanced_max`]: Math.max(...balanced),
    [`${prefix}/mean`]: total / k,
  };
}

export interface BalanceBatchOptions {
  /** Balance each consecutive mini-batch of this many rows separately (verl keep_minibatch). */
  miniBatchSize?: number;
  prefix?: string;
}

/**
 * The driver's batch balancing: equal-size KK partitions of the rows over `dpSize`
 * ranks by workload, each partition ordered small-large-...-large-small, concatenated.
 * Apply with `batch.reorder(order)`; chunk i of the result goes to rank i.
 */
export function balanceBatchOrder(seqLens: readonly number[], dpSize: number, opts: BalanceBatchOptions = {}): { order: number[]; metrics: Record<string, number> } {
  const workload = seqLens.map(calculateWorkload);
  let partitions: number[][];
  if (opts.miniBatchSize) {
    const mb = opts.miniBatchSize;
    if (seqLens.length % mb !== 0) throw new Error(`batch of ${seqLens.length} rows is not a whole number of mini-batches of ${mb}`);
    partitions = Array.from({ length: dpSize }, () => []);
    for (let off = 0; off < seqLens.length; off += mb) {
      getSeqlenBalancedPartitions(workload.slice(off, off + mb), dpSize, true).forEach((p, j) => partitions[j]!.push(...p.map((x) => x + off)));
    }
  } else partitions = getSeqlenBalancedPartitions(workload, dpSize, true);
  partitions = partitions.map((p) => {
    const s = [...p].sort((a, b) => workload[a]! - workload[b]! || a - b);
    return [...s.filter((_, i) => i % 2 === 0), ...s.filter((_, i) => i % 2 === 1).reverse()];
  });
  return { order: partitions.flat(), metrics: logSeqlenUnbalance(seqLens, partitions, opts.prefix ?? "global_seqlen") };
}

export function ceildiv(a: number, b: number): number {
  return Math.ceil(a / b);
}

export function roundupDivisible(a: number, b: number): number {
  return Math.ceil(a / b) * b;
}

export interface RearrangeOptions {
  /** The padded sequence length; max_token_len must be at least this. Default max(seqLens). */
  maxSeqLen?: number;
  /** Force at least this many micro-batches (pass the max over ranks so every rank runs the same number). */
  minNumMicroBatch?: number;
  /** Round the count up to a multiple of this (virtual pipeline size). */
  numBatchesDividedBy?: number;
  /** Order micro-batches heavy-to-light with the light ones at both ends (verl default true). */
  useDynamicBszBalance?: boolean;
}

/** How many micro-batches a token budget needs: min(B, ⌈Σ lengths / max_token_len⌉). */
export function numMicroBatchesFor(seqLens: readonly number[], maxTokenLen: number): number {
  const total = seqLens.reduce((a, b) => a + b, 0);
  return Math.min(seqLens.length, ceildiv(total, maxTokenLen));
}

/**
 * Dynamic batch size (use_dynamic_bsz): split rows into micro-batches of about
 * `maxTokenLen` tokens, balanced by workload. `seqLens` are the attended tokens per row.
 * Returns the row indices of each micro-batch; restore order with getReverseIdx.
 */
export function rearrangeMicroBatches(seqLens: readonly number[], maxTokenLen: number, opts: RearrangeOptions = {}): number[][] {
  if (seqLens.length === 0) throw new Error("rearrangeMicroBatches: empty batch");
  const maxSeqLen = opts.maxSeqLen ?? Math.max(...seqLens);
  if (maxTokenLen < maxSeqLen) {
    throw new Error(`ppo_max_token_len_per_gpu (${maxTokenLen}) must be at least the sequence length (${maxSeqLen})`);
  }
  let n = numMicroBatchesFor(seqLens, maxTokenLen);
  if (opts.minNumMicroBatch !== undefined) n = Math.max(opts.minNumMicroBatch, n);
  if (opts.numBatchesDividedBy !== undefined) n = roundupDivisible(n, opts.numBatchesDividedBy);
  if (n > seqLens.length) throw new Error(`cannot make ${n} non-empty micro-batches from ${seqLens.length} rows`);
  const workloads = seqLens.map(calculateWorkload);
  let parts = getSeqlenBalancedPartitions(workloads, n, false);
  if (opts.useDynamicBszBalance ?? true) {
    const weight = (p: number[]) => p.reduce((a, i) => a + workloads[i]!, 0);
    parts = [...parts].sort((a, b) => weight(b) - weight(a) || (b[0] ?? 0) - (a[0] ?? 0));
    parts = [...parts.filter((_, i) => i % 2 === 0).reverse(), ...parts.filter((_, i) => i % 2 === 1)];
  }
  return parts;
}

/** Inverse of a permutation given as concatenated index lists: out[idx] = position. */
export function getReverseIdx(indices: readonly number[]): number[] {
  const out = new Array<number>(indices.length);
  indices.forEach((idx, pos) => (out[idx] = pos));
  return out;
}
