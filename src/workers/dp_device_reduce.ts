// The data-parallel gradient summed on each rank's GPU, for WebGPU ranks of one process (issue 23:
// a second rank made a 0.5B step 6-9x slower). The host path (dp_optimizer.ts) reads every rank's
// whole gradient back into its shared region, sums the slices there in JavaScript and uploads the
// sum: 1.43 GB each way and 179M additions a rank at the 0.5B shape, where the sum alone took
// 1.4-1.9 s on the H100's host. Here each rank reads back only what the others need of its
// gradient, uploads the others' values for what it updates straight from their regions, and adds
// them on its GPU in rank order, where its own values already are:
//   1. read-back: G[0, n) outside this rank's range (sharded: the others' slices; replicated: all of
//      it) into its region at the same offsets;
//   2. barrier; each peer's values for this rank's range uploaded from the peer's region; the sum
//      formed in rank order ((g_0 + g_1) + g_2 ..., each sum rounded to float32; two ranks give the host sum's bits);
//   3. the squares of this rank's slice of (sum gradScale) on the device (two dispatches), one read,
//      the partials all-reduced with the scalars riding along (also the barrier after the last read
//      of a peer's gradient values);
//   4. AdamW with the loss-scale division and the clip inside its kernel; sharded, the new slice is
//      read back into the region, and after a barrier every variable outside it is uploaded from its
//      owner's region (no host all-gather), then a last barrier. (Replicated, no region is read after
//      the all-reduce of part 3.)
// The sum and the parameters have the host path's bits when no clip applies; the norm's squares add
// in float32 on the device (a fixed tree: the same bits every run, sharded or replicated) where the
// host adds them in float64, so the norm (and a clip coefficient from it) may differ in its last bits.
import * as tf from "@tensorflow/tfjs";
import type { AdamW } from "../engine/optim/adamw.js";
import { clipCoefficient, type FlatGradAccumulator, normOfPartials } from "../engine/optim/grad_utils.js";
import { fusedLayersFor } from "../engine/webgpu_fused.js";
import { fusedSumSquares } from "../engine/webgpu_fused_adamw.js";
import { canReadInto, readIntoBuckets, uploadTensor } from "../engine/webgpu_transfer.js";
import { envSwitch } from "../utils/env_switch.js";
import type { PhaseProfile } from "../utils/phase_profile.js";

/** What the device reduce needs of the collective (Collective in one process has all of it). */
export interface PeerCollective {
  readonly rank?: number;
  readonly worldSize?: number;
  readonly waitMs?: number;
  barrier?(): void;
  allReduce(buf: Float32Array | Float64Array, op?: "sum" | "mean" | "max" | "min"): void;
  peerRegions?(elems: number): Float32Array[] | undefined;
}

export interface DeviceReduceSpec {
  collective: PeerCollective;
  acc: FlatGradAccumulator;
  optimizer: AdamW;
  vars: tf.Variable[];
  /** The ranks' slices of the flat vector (W + 1 offsets): the norm's partition and, sharded, the optimizer's. */
  rankBounds: readonly number[];
  /** Each rank updates only its slice (ZeRO-1 over all ranks); else every rank updates all of it. */
  sharded: boolean;
  lr: number;
  gradClip: number | null;
  /** Read-back bucket (values). */
  bucket: number;
}

export interface DeviceReduceResult { gradNorm: number; skipped: boolean; scalars: Float64Array }

/**
 * Whether a step can take the device reduce: WebGPU, more than one rank, sharded over all of them or
 * replicated, a collective that lends its peers' regions. VERL_WEBGPU_DEVICE_REDUCE=0: the host path.
 */
export function deviceReduceApplies(collective: PeerCollective, shards: number): boolean {
  const W = collective.worldSize ?? 1;
  return W > 1 && (shards === 1 || shards === W) && tf.getBackend() === "webgpu" && !!collective.peerRegions && !!collective.barrier &&
    envSwitch("VERL_WEBGPU_DEVICE_REDUCE", true);
}

/**
 * One optimizer step with the gradient summed on the device (the header's four parts), or undefined
 * (nothing taken, on every rank alike) when some rank has no shared region of the size: then the host path.
 */
export async function deviceReduceStep(spec: DeviceReduceSpec, scalarsIn: number[], gradScale: number, prof?: PhaseProfile | null): Promise<DeviceReduceResult | undefined> {
  const c = spec.collective, W = c.worldSize ?? 1, r = c.rank ?? 0, n = spec.acc.numel;
  const views = c.peerRegions!(n);
  if (!views) return undefined;
  const waited = () => c.waitMs ?? 0;
  let w0 = waited();
  const mark = (phase: string) => {
    prof?.mark(phase);
    prof?.move(phase, "wait_for_peers", waited() - w0);
    w0 = waited();
  };
  const mine = views[r]!, lo = spec.rankBounds[r]!, hi = spec.rankBounds[r + 1]!;
  // the range this rank sums and updates
  const [from, to] = spec.sharded ? [lo, hi] : [0, n];
  const G = spec.acc.takeTensor();
  let sum: tf.Tensor1D | undefined;
  try {
    // 1. what the others need of this rank's gradient, into its region where it lies
    const need: [number, number][] = spec.sharded ? [[0, lo], [hi, n]] : [[0, n]];
    await Promise.all(need.filter(([a, b]) => a < b).flatMap(([a, b]) => readRange(G, a, b, mine, a, spec.bucket)));
    mark("read_back");
    c.barrier!();
    mark("exchange_wait");
    // 2. the others' values for [from, to) up, summed in rank order
    if (to > from) {
      sum = tf.tidy(() => {
        let s: tf.Tensor1D | undefined;
        for (let k = 0; k < W; k++) {
          const part = k === r ? (from === 0 && to === n ? G : G.slice(from, to - from)) : uploadTensor(views[k]!.subarray(from, to), [to - from]) as tf.Tensor1D;
          s = s ? (s.add(part) as tf.Tensor1D) : part === G ? G.clone() : part;
        }
        return s!;
      });
    }
    G.dispose();
    mark("upload_sum");
    // 3. this rank's slice's squares on the device; the partials (each from one rank: exact) and the
    // scalars summed over ranks in one call, the scalars as the host path sums them (float32 values
    // added in float64 in rank order, rounded once)
    const sums = new Float64Array(W + scalarsIn.length);
    sums[r] = await sumSquaresOf(sum, lo - from, hi - from, gradScale);
    scalarsIn.forEach((x, i) => { sums[W + i] = Math.fround(x); });
    c.allReduce(sums, "sum");
    const gradNorm = normOfPartials(sums.subarray(0, W));
    const scalars = Float64Array.from(sums.subarray(W), Math.fround);
    mark("norm");
    const skipped = !Number.isFinite(gradNorm);
    if (!skipped) {
      const coef = clipCoefficient(gradNorm, spec.gradClip);
      // 4. AdamW, the loss-scale division and the clip inside its kernel
      if (!spec.sharded) {
        spec.optimizer.stepFlat(sum!, spec.lr, [gradScale, coef]);
        mark("optimizer");
      } else {
        await stepSliceAndGather(spec, views, sum, gradScale, coef, mark);
      }
    }
    return { gradNorm, skipped, scalars };
  } finally {
    if (!G.isDisposed) G.dispose();
    sum?.dispose();
  }
}

/** t[a, b) into dst[at, at + b - a): buffer copies where the backend allows (webgpu_transfer.ts), else through tfjs's read. */
function readRange(t: tf.Tensor1D, a: number, b: number, dst: Float32Array, at: number, bucket: number): Promise<void>[] {
  if (canReadInto(t)) return readIntoBuckets(t, dst, at, bucket, a, b);
  const piece = a === 0 && b === t.size ? t.clone() : t.slice(a, b - a);
  return [piece.data<"float32">().then((v) => dst.set(v as Float32Array, at)).finally(() => piece.dispose())];
}

/** The sum of squares of (sum gradScale)[a, b), read back (0 for an empty range). */
async function sumSquaresOf(sum: tf.Tensor1D | undefined, a: number, b: number, gradScale: number): Promise<number> {
  if (!sum || b <= a) return 0;
  const t = tf.tidy(() => {
    const part = a === 0 && b === sum.size ? sum : sum.slice(a, b - a);
    return fusedLayersFor(part) ? fusedSumSquares(part, gradScale) : part.mul(gradScale).square().sum();
  });
  try {
    return (await t.data())[0]!;
  } finally {
    t.dispose();
  }
}

/**
 * Sharded: AdamW on this rank's slice (the variables wholly inside it assigned on the device), the
 * new slice read back into the region, and after a barrier every other variable uploaded from the
 * regions of the ranks that own its values (a variable across owners is put together in this rank's
 * region first, outside its own slice, where only its spent gradient values were), then a barrier.
 */
async function stepSliceAndGather(spec: DeviceReduceSpec, views: Float32Array[], sum: tf.Tensor1D | undefined, gradScale: number, coef: number,
  mark: (phase: string) => void): Promise<void> {
  const c = spec.collective, r = c.rank ?? 0, b = spec.rankBounds, lo = b[r]!, hi = b[r + 1]!, mine = views[r]!;
  if (sum) {
    const next = spec.optimizer.stepSlice(sum, spec.lr, [gradScale, coef]);
    try {
      await Promise.all(readRange(next, 0, next.size, mine, lo, spec.bucket));
    } finally {
      next.dispose();
    }
  } else {
    spec.optimizer.stepSlice(new Float32Array(0), spec.lr).dispose(); // an empty slice still counts the step
  }
  mark("shard_step");
  c.barrier!();
  mark("gather_wait");
  const W = b.length - 1, ownerOf = (i: number) => {
    let s = 0;
    while (s < W - 1 && i >= b[s + 1]!) s++;
    return s;
  };
  let o = 0;
  for (const v of spec.vars) {
    const size = v.size, end = o + size;
    if (size > 0 && !(o >= lo && end <= hi)) {
      const first = ownerOf(o), last = ownerOf(end - 1);
      let src: Float32Array;
      if (first === last) src = views[first]!.subarray(o, end);
      else {
        for (let s = first; s <= last; s++) if (s !== r) mine.set(views[s]!.subarray(Math.max(o, b[s]!), Math.min(end, b[s + 1]!)), Math.max(o, b[s]!));
        src = mine.subarray(o, end);
      }
      tf.tidy(() => v.assign(uploadTensor(src, v.shape)));
    }
    o = end;
  }
  mark("gather_upload");
  // the peers' slices are read: the regions are their owners' again (the next step writes them)
  c.barrier!();
  mark("final_wait");
}
