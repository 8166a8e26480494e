// One data-parallel optimizer step for a model whose replica lives on every rank:
// micro-batch gradients accumulate as one flat vector; at the end of a mini-batch
// they are SUMMED across ranks with the collective (losses are normalised by the
// global token / sequence count, so the sum is the mini-batch gradient), clipped
// by global norm, and applied with AdamW at the scheduled learning rate. A few
// scalars ride along in the same all-reduce so loss metrics come out global too.
// Sharded (ZeRO-1, `shards` > 1): each rank keeps AdamW state for one contiguous
// slice of the flat parameter vector and updates only that slice; the gradient is
// reduce-scattered (all-reduced when the shards are replicated, hybrid), the clip
// norm is the sum of the slices' squared norms, and the updated slices are
// all-gathered. The norm is summed per rank slice in rank order whatever the
// sharding, so sharded and replicated runs give the same bits. In one process the
// flat gradient lies in the rank's direct region of the collective (read back
// into it, reduced in place with the loss-scale division and the squares folded
// into the same pass, the updated slices gathered from the owners' regions).
import { phaseProfile, type PhaseProfile } from "../utils/phase_profile.js";
import * as tf from "@tensorflow/tfjs";
import { AdamW, type AdamWState } from "../engine/optim/adamw.js";
import { fusedLayersFor } from "../engine/webgpu_fused.js";
import { fusedGradNorm } from "../engine/webgpu_fused_adamw.js";
import { canReadInto, canWriteDirect, readIntoBuckets, uploadTensor } from "../engine/webgpu_transfer.js";
import { envSwitch } from "../utils/env_switch.js";
import { deviceReduceApplies, deviceReduceStep } from "./dp_device_reduce.js";
import { clipCoefficient, FlatGradAccumulator, normOfPartials, readTensorInto, scaleInPlace, shardBounds, sumSquares } from "../engine/optim/grad_utils.js";
import { LrScheduler, type LrSchedulerState } from "../engine/optim/lr_scheduler.js";
import type { TensorData } from "../protocol/tensor.js";
import { getLrSchedule, type AggLossOptions } from "../trainer/ppo/core_algos/index.js";
import { tokenAndSequenceCounts } from "./batching.js";
import type { ConfigView } from "./config_view.js";

/** What the collective offers (Worker.collective). */
export interface AllReducer {
  allReduce(buf: Float32Array | Float64Array, op?: "sum" | "mean" | "max" | "min"): void;
  /** Ranks taking part (1: nothing to reduce). */
  readonly worldSize?: number;
  /** Bucket boundaries at multiples of this keep one call's bits (RankCollective.bucketAlignElems). */
  readonly bucketAlignElems?: number;
  /** A buffer allReduce reduces without copying it in or out (RankCollective.reduceBuffer; undefined: none). */
  reduceBuffer?(elems: number): Float32Array | undefined;
  /** Whether a buffer lies in this rank's direct region (RankCollective.inRegion). */
  inRegion?(buf: ArrayBufferView): boolean;
  /** The gradient's reduce with the scale and the squares folded in (RankCollective.reduceScaled). */
  reduceScaled?(buf: Float32Array, bounds: ArrayLike<number>, opts: { scatter: boolean; scale?: number; acc?: number }): number;
  /** This rank (0 when absent: one rank). */
  readonly rank?: number;
  /** ms blocked waiting for peers so far (RankCollective.waitMs): a profile tells it from the work. */
  readonly waitMs?: number;
  /** RankCollective.reduceScatter / allGather: needed by a sharded optimizer. */
  reduceScatter?(buf: Float32Array, bounds: ArrayLike<number>): void;
  allGather?(buf: Float32Array, bounds: ArrayLike<number>): void;
  /** RankCollective.barrier and peerRegions: needed by the device reduce (dp_device_reduce.ts). */
  barrier?(): void;
  peerRegions?(elems: number): Float32Array[] | undefined;
}

/** The gradient all-reduce's bucket: about this many bytes (torch DDP's bucket_cap_mb is 25). */
export const DEFAULT_BUCKET_BYTES = 16 << 20;

/** Bucket elements for a collective: about `bytes` of float32, a multiple of its alignment. */
export function bucketElems(align: number | undefined, bytes = DEFAULT_BUCKET_BYTES): number {
  const a = align ?? 1, want = Math.max(1, Math.floor(bytes / 4));
  return Math.max(a, Math.round(want / a) * a);
}

/**
 * All-reduces (sum) `buf` bucket by bucket: bucket i covers [i*B, (i+1)*B) and is reduced once
 * `parts[i]` (this rank's values for it) is in, while the later parts are still being read back.
 * Whatever `buf` holds past the parts (scalars riding along) is reduced with the last bucket.
 * B must be a multiple of the collective's bucketAlignElems (or cover all of `buf`): then the bits equal one call's.
 * With `bounds` (W+1 offsets from 0: the ranks' slices) it is a reduceScatter instead: each bucket's
 * call gets the bounds clipped to it, and what lies past bounds[W] is reduced on every rank.
 */
export async function allReduceBuckets(collective: AllReducer, buf: Float32Array, parts: Promise<Float32Array | void>[], B: number, bounds?: readonly number[], prof?: PhaseProfile | null): Promise<void> {
  const name = bounds ? "reduceScatterBuckets" : "allReduceBuckets";
  if (bounds && !collective.reduceScatter) throw new Error(`${name}: the collective has no reduceScatter`);
  await eachBucket(name, collective, buf, parts, B, prof, (sub, o) => {
    if (bounds) collective.reduceScatter!(sub, bounds.map((b) => Math.min(sub.length, Math.max(0, b - o))));
    else collective.allReduce(sub, "sum");
    prof?.mark("collective");
  });
}

/**
 * The bucket walk both reduces share: B checked against the collective's alignment, then each
 * bucket [o, o + B) of `buf` in order, its read-back part (if any) awaited and copied in first.
 */
async function eachBucket(name: string, collective: AllReducer, buf: Float32Array, parts: Promise<Float32Array | void>[], B: number, prof: PhaseProfile | null | undefined,
  reduce: (sub: Float32Array, o: number) => void): Promise<void> {
  // one bucket over the whole buffer is one call whatever its size
  if (collective.bucketAlignElems !== undefined && B < buf.length && B % collective.bucketAlignElems !== 0) {
    throw new Error(`${name}: bucket of ${B} elements is not a multiple of the collective's ${collective.bucketAlignElems}`);
  }
  let i = 0, o = 0;
  do {
    const end = Math.min(buf.length, o + B);
    if (i < parts.length) {
      const part = await parts[i]!;
      prof?.mark("read_back_wait");
      if (part) { // else the read-back wrote it in place
        buf.set(part, o);
        prof?.mark("copy_in");
      }
    }
    reduce(buf.subarray(o, end), o);
    i++;
    o = end;
  } while (o < buf.length);
}

export interface GradientReduceSpec {
  /** The ranks' slices of the flat gradient (W+1 offsets from 0; past bounds[W] the scalars riding along). */
  bounds: readonly number[];
  /** Each rank needs only its slice (ZeRO-1 across all ranks): a reduce-scatter; else an all-reduce. */
  scatter: boolean;
  /** Multiplies the summed gradient (1 / the loss scale); 1 leaves it. */
  scale: number;
}

/**
 * The step's gradient reduce, bucket by bucket as allReduceBuckets (the same bucket rule and
 * bits): the sum over ranks, then `scale` applied to [bounds[0], bounds[W]) (only this rank's
 * slice when `scatter`), and this rank's slice's sum of squares (float64, in order) returned.
 * A collective with reduceScaled does the three in one pass; otherwise they are passes of their own.
 */
export async function reduceGradient(collective: AllReducer, buf: Float32Array, parts: Promise<Float32Array | void>[], B: number, spec: GradientReduceSpec, prof?: PhaseProfile | null): Promise<number> {
  const W = spec.bounds.length - 1, rank = collective.rank ?? 0;
  if (spec.scatter && !collective.reduceScaled && !collective.reduceScatter) throw new Error("reduceGradient: the collective has no reduceScatter");
  let acc = 0;
  await eachBucket("reduceGradient", collective, buf, parts, B, prof, (sub, o) => {
    const bounds = spec.bounds.map((b) => Math.min(sub.length, Math.max(0, b - o)));
    const waited = collective.waitMs ?? 0;
    if (collective.reduceScaled) {
      acc = collective.reduceScaled(sub, bounds, { scatter: spec.scatter, scale: spec.scale, acc });
    } else {
      if (spec.scatter) collective.reduceScatter!(sub, bounds);
      else collective.allReduce(sub, "sum");
      const lo = bounds[rank]!, hi = bounds[rank + 1]!;
      if (spec.scale !== 1) scaleInPlace(sub, spec.scale, spec.scatter ? lo : bounds[0]!, spec.scatter ? hi : bounds[W]!);
      acc = sumSquares(sub, lo, hi, acc);
    }
    prof?.mark("reduce_scale_squares");
    prof?.move("reduce_scale_squares", "wait_for_peers", (collective.waitMs ?? 0) - waited);
  });
  return acc;
}

/**
 * Whether an optimizer name means AdamW: torch's class name in any case (FSDP, VeOmni) or Megatron's
 * `adam` (verl's Megatron default), whose weight decay is decoupled, i.e. AdamW.
 */
export function isAdamW(name: string): boolean {
  return name.toLowerCase() === "adamw" || name === "adam";
}

export interface DpOptimizerState {
  optimizer: AdamWState;
  scheduler: LrSchedulerState;
}

export interface StepResult {
  gradNorm: number;
  /** True when the norm was not finite and the update was skipped. */
  skipped: boolean;
  /** The extra scalars, summed over ranks. */
  scalars: Float64Array;
  /** True when the ranks' gradients were summed on their GPUs (dp_device_reduce.ts), not in host memory. */
  deviceReduce?: boolean;
}

/** torch AdamW keywords that only pick a kernel (same arithmetic here). */
const KERNEL_FLAGS = ["foreach", "fused", "capturable", "differentiable"];

/**
 * AdamW's arguments from an optim section: lr, betas, eps, weight_decay, then verl's
 * override_optimizer_config on top (keywords for the optimizer's constructor: torch's lr,
 * weight_decay, betas, eps, amsgrad/maximize at false and the kernel flags, or Megatron's
 * adam_beta1, adam_beta2, adam_eps); any other keyword is refused by name.
 */
export function adamWArgs(optim: ConfigView): { lr: number; betas: [number, number]; eps: number; weightDecay: number } {
  const betas = optim.raw("betas") ?? [0.9, 0.999];
  const checkBetas = (b: unknown, key: string): [number, number] => {
    if (!Array.isArray(b) || b.length !== 2 || !b.every((x) => typeof x === "number")) throw new Error(`${key} must be a list of two numbers, got ${JSON.stringify(b)}`);
    return b as [number, number];
  };
  const out = { lr: optim.num("lr"), betas: checkBetas(betas, optim.key("betas")), eps: optim.num("eps", 1e-8), weightDecay: optim.num("weight_decay", 0.01) };
  const over = optim.raw("override_optimizer_config");
  if (over === undefined || over === null) return out;
  const where = optim.key("override_optimizer_config");
  if (typeof over !== "object" || Array.isArray(over)) throw new Error(`${where} must be a mapping of optimizer keywords, got ${JSON.stringify(over)}`);
  const num = (k: string, v: unknown) => {
    if (typeof v !== "number" || !Number.isFinite(v)) throw new Error(`${where}.${k} must be a number, got ${JSON.stringify(v)}`);
    return v;
  };
  for (const [k, v] of Object.entries(over as Record<string, unknown>)) {
    if (k === "lr") out.lr = num(k, v);
    else if (k === "weight_decay") out.weightDecay = num(k, v);
    else if (k === "eps" || k === "adam_eps") out.eps = num(k, v);
    else if (k === "betas") out.betas = checkBetas(v, `${where}.betas`);
    else if (k === "adam_beta1") out.betas = [num(k, v), out.betas[1]];
    else if (k === "adam_beta2") out.betas = [out.betas[0], num(k, v)];
    else if ((k === "amsgrad" || k === "maximize") && v === false) continue;
    else if (KERNEL_FLAGS.includes(k)) continue;
    else throw new Error(`${where}.${k}=${JSON.stringify(v)}: verl-ts's AdamW takes lr, weight_decay, betas, eps (adam_beta1, adam_beta2, adam_eps), ${KERNEL_FLAGS.join(", ")}, and amsgrad/maximize only false`);
  }
  return out;
}

export interface DpOptimizerOptions {
  /**
   * Norm, clip and AdamW on the backend, reading back only the norm. Only possible on one
   * rank (there is nothing to all-reduce); the default on WebGPU, where reading the flat
   * gradient back and uploading it again cost 87% of a 0.5B update (docs/gpu.md).
   */
  onDevice?: boolean;
  /**
   * Ranks that share one copy of the optimizer state, each holding a 1/shards slice (ZeRO-1):
   * 1 (default) replicates it, the world size shards it across all ranks, a divisor of the world
   * size shards it within groups of consecutive ranks and replicates it across the groups (verl's
   * hybrid sharding; src/workers/optimizer_sharding.ts reads it from verl's keys).
   */
  shards?: number;
}

export class DataParallelOptimizer {
  readonly optimizer: AdamW;
  readonly scheduler: LrScheduler;
  /** Ranks sharing one copy of the state (1: replicated); this rank's shard and its slice of the flat vector. */
  readonly shards: number;
  readonly shardIndex: number;
  readonly numel: number;
  private readonly acc: FlatGradAccumulator;
  private readonly onDevice: boolean;
  private readonly worldSize: number;
  private readonly rank: number;
  /** Slice bounds of the shards (shards + 1) and of the ranks (worldSize + 1; the norm's partition). */
  private readonly shardBounds: number[];
  private readonly rankBounds: number[];

  /**
   * `optim` is the role's optim section (lr, weight_decay, betas, lr schedule keys);
   * `totalSteps` is the number of training steps the schedule spans.
   */
  constructor(
    readonly vars: tf.Variable[],
    optim: ConfigView,
    totalSteps: number,
    private readonly collective: AllReducer,
    private readonly gradClip: number | null,
    opts: DpOptimizerOptions = {},
  ) {
    this.worldSize = collective.worldSize ?? 1;
    this.rank = collective.rank ?? 0;
    this.onDevice = opts.onDevice ?? (collective.worldSize === 1 && tf.getBackend() === "webgpu");
    if (this.onDevice && this.worldSize !== 1) throw new Error("DataParallelOptimizer: the on-device step needs a world size of 1");
    const shards = opts.shards ?? 1;
    if (!(Number.isInteger(shards) && shards >= 1 && shards <= this.worldSize && this.worldSize % shards === 0)) {
      throw new Error(`DataParallelOptimizer: ${shards} optimizer shards do not divide the world size ${this.worldSize}`);
    }
    if (shards > 1 && (!collective.allGather || (shards === this.worldSize && !collective.reduceScatter))) {
      throw new Error("DataParallelOptimizer: a sharded optimizer needs a collective with reduceScatter and allGather");
    }
    this.shards = shards;
    this.shardIndex = this.rank % shards;
    const name = optim.str("optimizer", "AdamW");
    if (!isAdamW(name)) throw new Error(`${optim.key("optimizer")}='${name}' is not available; verl-ts implements AdamW`);
    const { lr, betas, eps, weightDecay } = adamWArgs(optim);
    this.acc = new FlatGradAccumulator(vars);
    this.numel = this.acc.numel;
    this.shardBounds = shardBounds(this.numel, shards);
    this.rankBounds = shardBounds(this.numel, this.worldSize);
    const range: [number, number] = [this.shardBounds[this.shardIndex]!, this.shardBounds[this.shardIndex + 1]!];
    this.optimizer = new AdamW(vars, { lr, betas, eps, weightDecay, range });
    const schedule = getLrSchedule(optim.section() as Parameters<typeof getLrSchedule>[0], totalSteps);
    this.scheduler = new LrScheduler(lr, (s) => schedule.ratio(s));
  }

  /** [start, end) of the flat parameter vector whose optimizer state this rank holds. */
  get range(): [number, number] {
    return this.optimizer.range;
  }

  get lr(): number {
    return this.scheduler.lr;
  }

  /** Sum small host values over ranks (mini-batch token counts and the like). */
  allReduceSum(buf: Float64Array): void {
    this.collective.allReduce(buf, "sum");
  }

  /**
   * aggLoss options for one mini-batch: its token count, non-empty sequence count and
   * row count summed over ranks, so every micro-batch loss on every rank shares one
   * denominator (seq-mean-token-sum-norm divides by scaleFactor (default T) x rows).
   */
  globalLossNorm(responseMask: TensorData, scaleFactor: number | null): AggLossOptions {
    const counts = tokenAndSequenceCounts(responseMask);
    const global = Float64Array.of(counts.tokens, counts.sequences, responseMask.shape[0]!);
    this.allReduceSum(global);
    return {
      dpSize: 1,
      batchNumTokens: global[0]!,
      globalBatchSize: global[1]!,
      lossScaleFactor: (scaleFactor ?? responseMask.shape[1]!) * global[2]!,
    };
  }

  accumulate(grads: tf.NamedTensorMap): void {
    this.acc.add(grads);
  }

  /**
   * End of a mini-batch: all-reduce (with `scalars` appended), clip, step. `gradScale` multiplies
   * the summed gradient first: 1 / the loss scale of 16-bit products, applied once to the sum
   * rather than to every micro-batch's gradients (a power of two, so the same bits either way).
   * `scalars` may come as a function that reads them: the on-device step records its norm and
   * update before it waits for them, so the device runs on from the backward pass into the step
   * while the host waits for one read of both.
   */
  async step(scalars: number[] | (() => Promise<number[]>) = [], gradScale = 1): Promise<StepResult> {
    if (this.onDevice) return this.stepOnDevice(scalars, gradScale);
    if (typeof scalars === "function") scalars = await scalars();
    // VERL_PROFILE_UPDATE=1: where a host-reduced step's time goes (read-back waits, the collective
    // with its wait for the other ranks, the norm, the optimizer and its upload)
    const prof = phaseProfile(`optimizer.step rank ${this.rank}`);
    if (deviceReduceApplies(this.collective, this.shards)) {
      const res = await deviceReduceStep({
        collective: this.collective, acc: this.acc, optimizer: this.optimizer, vars: this.vars, rankBounds: this.rankBounds,
        sharded: this.shards > 1, lr: this.scheduler.lr, gradClip: this.gradClip, bucket: bucketElems(undefined),
      }, scalars, gradScale, prof);
      if (res) {
        prof?.print({ elems: this.numel, shards: this.shards, device_reduce: 1 });
        return { ...res, deviceReduce: true };
      }
    }
    // tf.variableGrads hands every gradient over at once when the backward pass ends, so buckets
    // cannot go out during it; what overlaps is the read-back of later buckets with the reduce
    // of earlier ones. Bucket bounds at multiples of the collective's alignment: the same bits
    // as one call over the whole buffer.
    const n = this.numel;
    // In one process the rank's direct region of the collective (the peers read it where it lies);
    // across hosts the leader's gradient lives in the bridge memory, reduced there without a copy in or out.
    const buf = this.collective.reduceBuffer?.(n + scalars.length) ?? this.hostBuffer(n + scalars.length);
    buf.set(scalars, n);
    // Only an asynchronous read-back (WebGPU) has something to overlap: elsewhere the read is
    // synchronous and the slices would be an extra pass (measured on wasm: 64 MiB read in 4 buckets
    // 131-205 ms against 118-177 whole), and one rank has nothing to reduce. Then one bucket,
    // read straight from the backend's memory into buf where it can be (cpu, wasm).
    const overlap = (this.collective.worldSize ?? 2) > 1 && tf.getBackend() === "webgpu";
    const B = overlap ? bucketElems(this.collective.bucketAlignElems) : Math.max(1, buf.length);
    // on WebGPU each bucket lands in buf itself as it maps (no intermediate array, no copy-in)
    const parts: Promise<Float32Array | void>[] = !overlap && this.acc.takeInto(buf) ? [] : this.acc.takeBucketsInto(buf, B) ?? this.acc.takeBuckets(B);
    prof?.mark("take_buckets");
    // Sharded across every rank, each needs only its slice of the sum; otherwise (replicated or
    // hybrid) every rank needs all of it. 1 / the loss scale goes on the part this rank uses.
    const sharded = this.shards > 1 && this.shards === this.worldSize;
    const own = await reduceGradient(this.collective, buf, parts, B, { bounds: this.rankBounds, scatter: sharded, scale: gradScale }, prof);
    const summed = Float64Array.from(buf.subarray(n));
    const [lo, hi] = this.range;
    const waited = this.collective.waitMs ?? 0;
    const gradNorm = this.globalNorm(own);
    prof?.mark("norm");
    prof?.move("norm", "wait_for_peers", (this.collective.waitMs ?? 0) - waited);
    const skipped = !Number.isFinite(gradNorm);
    if (!skipped) {
      const coef = clipCoefficient(gradNorm, this.gradClip);
      if (coef < 1) scaleInPlace(buf, coef, lo, hi);
      if (this.shards === 1) {
        this.optimizer.stepFlat(buf.subarray(0, n), this.scheduler.lr);
        prof?.mark("optimizer_upload_record");
      } else {
        await this.stepShard(buf, lo, hi, prof);
      }
    }
    prof?.print({ elems: n, buckets: Math.ceil(buf.length / B), shards: this.shards });
    return { gradNorm, skipped, scalars: summed };
  }

  /**
   * The host buffer a step reduces in, kept across steps: a fresh one is zeroed memory the OS maps
   * in on first write, which cost 1.1 s of a 0.5B step's 1.43 GB copy-in with two ranks on the H200
   * (2026-12-05). Every element is written before it is read (the parts cover the gradient, the
   * scalars follow), and tensors made from it copy (stepShard) or upload at once (stepFlat).
   */
  private hostBuffer(elems: number): Float32Array {
    if (this.reusedHostBuffer?.length !== elems) this.reusedHostBuffer = new Float32Array(elems);
    return this.reusedHostBuffer;
  }
  private reusedHostBuffer: Float32Array | undefined;

  /**
   * The gradient's norm: squared norms of the ranks' slices added in rank order. Each rank has its
   * own slice's (`own`, from the reduce) and gets the others' through an all-reduce in which each
   * slice's value comes from its rank alone (adding zeros: exact), sharded or not.
   */
  private globalNorm(own: number): number {
    const W = this.worldSize, partials = new Float64Array(W);
    partials[this.rank] = own;
    if (W > 1) this.collective.allReduce(partials, "sum");
    return normOfPartials(partials);
  }

  /** AdamW on this rank's slice, then the slices all-gathered into every rank's parameters. */
  private async stepShard(buf: Float32Array, lo: number, hi: number, prof?: PhaseProfile | null): Promise<void> {
    const n = this.numel;
    const next = this.optimizer.stepSlice(buf.subarray(lo, hi), this.scheduler.lr);
    // The gradient is spent: its buffer takes the parameters (in the direct region the others then
    // read this rank's slice where it lies) unless it is the bridge memory, which the next step
    // reuses while tensors made from it may still point at it (cpu and WebGPU keep the array).
    const params = this.collective.inRegion?.(buf) || !(buf.buffer instanceof SharedArrayBuffer) ? buf.subarray(0, n) : new Float32Array(n);
    try {
      // cpu and wasm: the slice straight from the backend's memory; WebGPU: read back into place
      // in buckets (webgpu_transfer.ts); else read back, then copied
      if (!readTensorInto(next, params, lo)) {
        if (canReadInto(next)) await Promise.all(readIntoBuckets(next, params, lo, bucketElems(undefined)));
        else params.set(await next.data<"float32">() as Float32Array, lo);
      }
    } finally {
      next.dispose();
    }
    prof?.mark("shard_step");
    // The first group of `shards` ranks contributes its slices; replicas of a shard (hybrid) hold the same bits.
    const W = this.worldSize, k = this.shards;
    const waited = this.collective.waitMs ?? 0;
    this.collective.allGather!(params, Array.from({ length: W + 1 }, (_, r) => (r <= k ? this.shardBounds[r]! : n)));
    prof?.mark("all_gather");
    prof?.move("all_gather", "wait_for_peers", (this.collective.waitMs ?? 0) - waited);
    // wasm copies a new tensor's values into its heap at once, and WebGPU's writeBuffer as it is
    // called (webgpu_transfer.ts): a view of the piece will do
    const direct = canWriteDirect(), copies = direct || tf.getBackend() === "wasm";
    let o = 0;
    for (const v of this.vars) {
      const size = v.size, inside = o >= lo && o + size <= hi;
      // variables wholly in the slice were assigned on the backend by stepSlice
      // elsewhere a copy of the piece: a view would keep (and hand to the tensor's readers) the whole flat buffer
      const piece = () => (copies ? params.subarray(o, o + size) : params.slice(o, o + size));
      if (!inside && size > 0) tf.tidy(() => v.assign(direct ? uploadTensor(piece(), v.shape) : tf.tensor(piece(), v.shape, "float32")));
      o += size;
    }
    prof?.mark("upload");
  }

  /** The same step with the gradient left on the backend (one rank): the norm is the only read. */
  private async stepOnDevice(scalarsIn: number[] | (() => Promise<number[]>), gradScale: number): Promise<StepResult> {
    const taken = this.acc.takeTensor();
    const readScalars = async () => Float64Array.from(typeof scalarsIn === "function" ? await scalarsIn() : scalarsIn);
    if (fusedLayersFor(taken)) return this.stepOnDeviceFused(taken, readScalars, gradScale);
    const grad = gradScale === 1 ? taken : tf.tidy(() => taken.mul(gradScale) as tf.Tensor1D);
    if (grad !== taken) taken.dispose();
    try {
      const scalars = await readScalars();
      const normT = tf.tidy(() => grad.square().sum().sqrt());
      const gradNorm = (await normT.data())[0]!;
      normT.dispose();
      const skipped = !Number.isFinite(gradNorm);
      if (!skipped) {
        const clip = this.gradClip !== null && this.gradClip > 0 ? this.gradClip / (gradNorm + 1e-6) : 1;
        tf.tidy(() => this.optimizer.stepFlat(clip < 1 ? grad.mul(clip) as tf.Tensor1D : grad, this.scheduler.lr));
      }
      return { gradNorm, skipped, scalars };
    } finally {
      grad.dispose();
    }
  }

  /**
   * stepOnDevice with the fused WebGPU kernels: the norm of (grad gradScale) in two dispatches, and
   * the update with the scale inside it and the clip (and the skip of a non-finite norm) decided on
   * the device from that norm. Everything is recorded before the one wait for the norm and the
   * scalars, so the device goes from the backward pass into the step without a round trip to the
   * host (VERL_DEVICE_CLIP=0: the norm read first, the clip passed in, as before). A skipped step's
   * count is taken back once the norm is read.
   */
  private async stepOnDeviceFused(taken: tf.Tensor1D, readScalars: () => Promise<Float64Array>, gradScale: number): Promise<StepResult> {
    const normT = fusedGradNorm(taken, gradScale);
    try {
      const maxNorm = this.gradClip !== null && this.gradClip > 0 ? this.gradClip : 0;
      // VERL_DEVICE_CLIP=0: the norm read before the update is recorded (the old order, for comparisons)
      if (envSwitch("VERL_DEVICE_CLIP", true) && this.optimizer.takesDeviceClip(taken)) {
        this.optimizer.stepFlat(taken, this.scheduler.lr, [gradScale, 1], { norm: normT, maxNorm });
        taken.dispose();
        const [scalars, norm] = await Promise.all([readScalars(), normT.data()]);
        const gradNorm = norm[0]!, skipped = !Number.isFinite(gradNorm);
        if (skipped) this.optimizer.revertSkippedStep();
        return { gradNorm, skipped, scalars };
      }
      const scalars = await readScalars();
      const gradNorm = (await normT.data())[0]!;
      const skipped = !Number.isFinite(gradNorm);
      if (!skipped) {
        const clip = clipCoefficient(gradNorm, maxNorm);
        this.optimizer.stepFlat(taken, this.scheduler.lr, [gradScale, clip]);
      }
      return { gradNorm, skipped, scalars };
    } finally {
      normT.dispose();
      if (!taken.isDisposed) taken.dispose();
    }
  }

  async stateDict(): Promise<DpOptimizerState> {
    return { optimizer: await this.optimizer.stateDict(), scheduler: this.scheduler.stateDict() };
  }

  loadStateDict(s: DpOptimizerState): void {
    this.optimizer.loadStateDict(s.optimizer);
    this.scheduler.loadStateDict(s.scheduler);
  }

  dispose(): void {
    this.acc.dispose();
    this.optimizer.dispose();
  }
}
