// The product a LoRA-adapted linear layer computes, fused with its gradient: plain LoRA, DoRA
// (a trained magnitude per output row), and dropout on the adapter branch.
import * as tf from "@tensorflow/tfjs";
import { splitRows, stackRows } from "../engine/copies.js";
import { onWasm } from "../engine/matmul.js";
import { markWeightLike } from "../engine/weight_like.js";
import { frozenStackProduct } from "../engine/frozen_weights.js";
import { onRelease } from "../engine/data_release.js";
import { float32MatMul, onTensorCores } from "../engine/webgpu_kernels.js";

type GradArgs = (tf.Tensor | tf.GradSaveFunc)[];

/** One output block of a fused LoRA product: its frozen weight and, when adapted, A and B. */
export interface LoraBlock {
  w: tf.Tensor2D;
  a?: tf.Tensor2D;
  b?: tf.Tensor2D;
  /**
   * DoRA: the magnitude m [out] (trained) and the row norms ||W + s B A|| [out], a constant: the
   * norm is detached from the gradient, as peft and Megatron-Bridge do (DoRA paper, section 4.3).
   */
  magnitude?: tf.Tensor1D;
  weightNorm?: tf.Tensor1D;
  /** Adapter dropout, as keep-masks already scaled by 1 / (1 - p): `dropIn` [N, in] on the branch's input (pre), `dropOut` [N, out] on its output (post). */
  dropIn?: tf.Tensor2D;
  dropOut?: tf.Tensor2D;
}

const t2 = (x: tf.Tensor) => tf.transpose(x) as tf.Tensor2D;

/** Which form of the product: see loraLinear. */
export type LoraPath = "auto" | "batched" | "blocks";

let defaultPath: LoraPath = "auto";

/** Sets the form loraLinear takes when its caller names none (the model's calls); returns the previous one. The bench and tests compare the forms with it. */
export function setLoraPath(path: LoraPath): LoraPath {
  const prev = defaultPath;
  defaultPath = path;
  return prev;
}

/**
 * x [N, in] through blocks stacked along the output axis, as one op with a hand-written gradient.
 * Per adapted block j, with xd = x (masked by dropIn when given) and l = s (xd A^T) B^T (masked by
 * dropOut when given):
 *   LoRA: x W^T + l
 *   DoRA: x W^T + (c - 1) (xd W^T) + c l, c = m / ||W + s B A|| per output row
 * (peft's form; without dropout DoRA is c (x W^T + l) = m (W + s B A) / ||W + s B A|| x.)
 * Built from tfjs ops, the sums and scalings would keep [N, out]-sized copies for the backward
 * pass (tfjs's Add and Mul gradients save their inputs), so LoRA would cost more activation
 * memory than full fine-tuning; here only x, the adapter weights and the masks are kept, and the
 * frozen W_j get no gradient.
 * `path`: "auto" takes the batched form (batchedLoraLinear) where it applies, "blocks" the
 * per-block form (any mix of blocks; tests and the dispatch bench compare the two).
 */
export function loraLinear(x: tf.Tensor2D, blocks: LoraBlock[], scale: number, path: LoraPath = defaultPath): tf.Tensor2D {
  if (path !== "blocks") {
    const plan = batchPlan(blocks);
    // stacked pre-dropout runs batched products, which wasm's matmul keeps off its fast path;
    // wasm is bound by arithmetic, not dispatches, so it keeps the per-block products there
    if (plan && (path === "batched" || !(plan.stacked && onWasm()))) return batchedLoraLinear(x, blocks, scale, plan);
    if (path === "batched") throw new Error("loraLinear: the batched path needs every block adapted with one rank, no DoRA, and dropout on all blocks or none");
  }
  const adapted = blocks.flatMap((bl, j) => (bl.a && bl.b ? [j] : []));
  // where each adapted block's inputs start among the op's differentiable inputs (after x): a, b[, m]
  const at: number[] = [];
  let n = 1;
  for (const j of adapted) { at.push(n); n += blocks[j]!.magnitude ? 3 : 2; }
  const ws = blocks.map((bl) => bl.w);
  const consts = blocks.flatMap((bl) => [bl.weightNorm, bl.dropIn, bl.dropOut].flatMap((t): tf.Tensor[] => (t ? [t] : [])));
  const stack = (parts: tf.Tensor[]) => stackRows(parts) as tf.Tensor2D;
  const sizes = blocks.map((bl) => bl.w.shape[0]);
  /** The adapter branch of block j: xd and l (both [N, *]), and DoRA's c [out] when it has one. */
  const branch = (xs: tf.Tensor2D, bl: LoraBlock, a: tf.Tensor2D, b: tf.Tensor2D, m: tf.Tensor | undefined) => {
    const xd = bl.dropIn ? (tf.mul(xs, bl.dropIn) as tf.Tensor2D) : xs;
    const h = matmulT(xd, a);
    const c = m && bl.weightNorm ? tf.div(m, bl.weightNorm) : undefined;
    // l [N, out] is needed in the backward pass only by DoRA's dm: computed on demand there
    const branchOut = () => {
      const l = matmulT(h, b).mul(scale) as tf.Tensor2D;
      return bl.dropOut ? (tf.mul(l, bl.dropOut) as tf.Tensor2D) : l;
    };
    return { xd, h, c, branchOut };
  };
  const op = tf.customGrad((...args: GradArgs) => {
    const xs = args[0] as tf.Tensor2D, save = args[args.length - 1] as tf.GradSaveFunc;
    const ins = args.slice(0, -1) as tf.Tensor[];
    save([...ins, ...ws, ...consts]);
    const value = tf.tidy(() => {
      const y = frozenStackProduct(xs, ws, true) ?? matmulT(xs, stack(ws));
      const deltas = blocks.map((bl, j) => {
        const k = adapted.indexOf(j);
        if (k < 0) return tf.zeros([xs.shape[0], sizes[j]!]);
        const i = at[k]!, m = bl.magnitude ? ins[i + 2] : undefined;
        const { xd, c, branchOut } = branch(xs, bl, ins[i] as tf.Tensor2D, ins[i + 1] as tf.Tensor2D, m);
        const l = branchOut();
        if (!c) return l;
        // (c - 1) xd W^T + c l, added to the base x W^T
        return tf.add(tf.mul(matmulT(xd, bl.w), tf.sub(c, 1)), tf.mul(l, c));
      });
      return tf.add(y, deltas.length === 1 ? deltas[0]! : tf.concat(deltas, 1));
    });
    return {
      value,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const x0 = saved[0] as tf.Tensor2D, sin = saved.slice(0, n), sw = saved.slice(n, n + ws.length) as tf.Tensor2D[];
        const g = dy as tf.Tensor2D;
        let dx: tf.Tensor = frozenStackProduct(g, sw, false) ?? tf.matMul(g, stack(sw));
        const parts = blocks.length === 1 ? [g] : tf.split(g, sizes, 1);
        const grads: tf.Tensor[] = [];
        adapted.forEach((j, k) => {
          const bl = blocks[j]!, i = at[k]!, gj = parts[j] as tf.Tensor2D;
          const a = sin[i] as tf.Tensor2D, b = sin[i + 1] as tf.Tensor2D, m = bl.magnitude ? sin[i + 2] : undefined;
          const { xd, h, c, branchOut } = branch(x0, bl, a, b, m);
          let gl = c ? (tf.mul(gj, c) as tf.Tensor2D) : gj; // dL/dl
          if (bl.dropOut) gl = tf.mul(gl, bl.dropOut) as tf.Tensor2D;
          const gh = tf.matMul(gl, b).mul(scale) as tf.Tensor2D; // [N, r]
          let dxd = tf.matMul(gh, a);
          if (c) dxd = dxd.add(tf.matMul(tf.mul(gj, tf.sub(c, 1)), sw[j]!)); // through (c - 1) xd W^T
          dx = dx.add(bl.dropIn ? tf.mul(dxd, bl.dropIn) : dxd);
          grads.push(matmulTN(gh, xd)); // dA [r, in]
          grads.push(matmulTN(gl, h).mul(scale)); // dB [out, r]
          // dm: y depends on m through c = m / n: dy/dm = (xd W^T + l) / n per output row
          if (c) grads.push(tf.sum(tf.mul(gj, tf.add(matmulT(xd, sw[j]!), branchOut())), 0).div(bl.weightNorm!));
        });
        return [dx, ...grads];
      }),
    };
  });
  const ins: tf.Tensor[] = [x];
  for (const j of adapted) {
    const bl = blocks[j]!;
    ins.push(bl.a!, bl.b!);
    if (bl.magnitude) {
      if (!bl.weightNorm) throw new Error("loraLinear: a DoRA block needs weightNorm beside its magnitude");
      ins.push(bl.magnitude);
    }
  }
  return op(...ins) as tf.Tensor2D;
}

/** How the batched form groups a call's blocks: the distinct (A, input mask) pairs are its slots. */
interface BatchPlan {
  /** The block whose A (and input mask) each slot takes. */
  slotBlock: number[];
  /** Each block's slot. */
  slotOf: number[];
  rank: number;
  /** Pre-dropout with several slots: each slot sees its own masked input, so the A products run batched. */
  stacked: boolean;
}

/** The batched form's plan, or undefined when the call needs the per-block form (DoRA, an unadapted block, mixed ranks or dropout). */
function batchPlan(blocks: LoraBlock[]): BatchPlan | undefined {
  const rank = blocks[0]?.a?.shape[0];
  const pre = !!blocks[0]?.dropIn, post = !!blocks[0]?.dropOut;
  if (blocks.some((bl) => !bl.a || !bl.b || bl.magnitude || bl.a.shape[0] !== rank || !!bl.dropIn !== pre || !!bl.dropOut !== post)) return undefined;
  // a shared A (tiedA) is one slot as long as its blocks share the input mask too (the same tensor)
  const slotBlock: number[] = [], slotOf = blocks.map((bl, j) => {
    const s = slotBlock.findIndex((i) => blocks[i]!.a === bl.a && blocks[i]!.dropIn === bl.dropIn);
    if (s >= 0) return s;
    slotBlock.push(j);
    return slotBlock.length - 1;
  });
  return { slotBlock, slotOf, rank: rank!, stacked: pre && slotBlock.length > 1 };
}

/**
 * The slots H is laid out in: the used ones (u), or more, empty, where that makes H's width u r a
 * multiple of 64 (16-bit products on WebGPU, several flat slots, 64 a multiple of r or r of 64). The
 * tensor-core products pad a width to 64 or 128 anyway; given as the operands' own width, H, dH and
 * gl^T H come out of their products without a slice of the padding, and one packed copy of H (of dH)
 * serves both products that read it (at the 0.5B shape, q/k/v's 3 x 32 = 96 columns: 5 kernels fewer a
 * pass). The empty slots' A rows and Bd columns are zero, so the products are unchanged.
 * VERL_LORA_PAD_SLOTS=0 keeps u slots.
 */
function slotCount(u: number, r: number, stacked: boolean): number {
  if (stacked || u < 2 || (u * r) % 64 === 0 || (64 % r !== 0 && r % 64 !== 0) || !onTensorCores() || process.env.VERL_LORA_PAD_SLOTS === "0") return u;
  return Math.ceil((u * r) / 64) * 64 / r;
}

/**
 * The batched form's constants for a block layout: `mask` [sum(out), slots * r] holds `scale` where
 * block j's rows meet its slot's columns (zero elsewhere); `own` [sum(out) * r] int32 indexes, in
 * the flattened [sum(out), slots * r], each row's own slot's r entries.
 * Kept across calls (made once per layout and backend): uploading them every pass would cost what
 * the batching saves.
 */
const layoutCache = new Map<string, { mask: tf.Tensor2D; own: tf.Tensor1D }>();

/** `slots` (at least the blocks' slots): columns of empty slots past the used ones pad H to it (see slotCount). */
function layoutConstants(sizes: number[], slotOf: number[], rank: number, scale: number, slots: number) {
  const key = `${tf.getBackend()}|${sizes}|${slotOf}|${rank}|${scale}|${slots}`;
  const hit = layoutCache.get(key);
  if (hit && !hit.mask.isDisposed && !hit.own.isDisposed) return hit;
  const rows = sizes.reduce((a, b) => a + b, 0), cols = slots * rank;
  const mask = new Float32Array(rows * cols), own = new Int32Array(rows * rank);
  let row = 0;
  sizes.forEach((n, j) => {
    const first = slotOf[j]! * rank;
    for (let o = row; o < row + n; o++) {
      mask.fill(scale, o * cols + first, o * cols + first + rank);
      for (let c = 0; c < rank; c++) own[o * rank + c] = o * cols + first + c;
    }
    row += n;
  });
  const made = { mask: tf.keep(tf.tensor2d(mask, [rows, cols])), own: tf.keep(tf.tensor1d(own, "int32")) };
  layoutCache.set(key, made);
  return made;
}

/**
 * A fused call's adapter operands, aCat (the A's stacked: [u, r, in] for stacked pre-dropout, else
 * [u r, in]) and Bd ([out, u r]), kept per call site while its A and B variables hold the same data:
 * they change only at an optimizer step, and a step runs the call many times (old log-probs, every
 * micro-batch's forward and backward), each of which would otherwise concatenate, mask and, under
 * 16-bit products, pack them again (about 7 dispatches a call). Keyed by the first B variable; calls
 * on copies of the variables (recomputed layers) build their own.
 */
interface AdapterOperands { ids: object[]; scale: number; aCat: tf.Tensor; bd: tf.Tensor2D; merged?: tf.Tensor2D }
/** Per call site (its first B variable): the operands in each A layout (stacked for pre-dropout training passes, flat otherwise, by slot count). */
const adapterOperandCache = new WeakMap<tf.Tensor, Map<string, AdapterOperands>>();

function adapterOperands(as: tf.Tensor2D[], bs: tf.Tensor2D[], layoutName: string, scale: number, build: () => { aCat: tf.Tensor; bd: tf.Tensor2D }): AdapterOperands {
  const vars = [...as, ...bs];
  // not variables (a one-off call): built every call, nothing kept (no ids)
  if (!vars.every((v) => v instanceof tf.Variable)) return { ids: [], scale, ...build() };
  let site = adapterOperandCache.get(bs[0]!);
  if (!site) adapterOperandCache.set(bs[0]!, (site = new Map()));
  const ids = vars.map((v) => v.dataId), hit = site.get(layoutName);
  if (hit && hit.scale === scale && !hit.aCat.isDisposed && !hit.bd.isDisposed && hit.ids.length === ids.length && hit.ids.every((id, i) => id === ids[i])) return hit;
  // a saved clone of the old ones (the backward pass of a call before the step) keeps its own
  // reference; a lone A is the variable itself (no concatenation), never disposed here
  if (hit) tf.dispose([hit.aCat, hit.bd, ...(hit.merged ? [hit.merged] : [])].filter((t) => !(t instanceof tf.Variable)));
  const made = build(), entry: AdapterOperands = { ids, scale, aCat: tf.keep(made.aCat), bd: tf.keep(made.bd) };
  markWeightLike(entry.aCat);
  markWeightLike(entry.bd);
  site.set(layoutName, entry);
  return entry;
}

/**
 * loraLinear for the common case: every block adapted, one rank, no DoRA, dropout on all blocks or
 * none. The adapter work of the whole call is a fixed number of products, whatever the block count
 * (the per-block form dispatches about 3 kernels a block forward and 8 backward, and the update is
 * bound by the host's cost per dispatch):
 *   H = xd [A_1; ...; A_u]^T                    [N, u r]   (one product; u slots of distinct A)
 *   l = H Bd^T (masked by dropOut)              [N, out]   Bd = [B_1 .. B_k] placed block-diagonally, times s
 *   dH = gl Bd, dA = dH^T xd (split by slot), dB = sum over slots of (gl^T H) * mask (split by block)
 * Bd is B broadcast over the slots times a constant mask that carries the scale, so s costs no
 * multiply of its own.
 * dB takes one product with the off-diagonal blocks masked out rather than a batched product: the
 * blocks' output sizes differ (q against k/v), which a batched product would have to pad and
 * re-slice, and the discarded part is small (u r columns against the base product's `in`).
 * With pre-dropout and several slots each slot's input is masked differently, so the A products run
 * as one batched product over a [u, N, in] stack.
 */
function batchedLoraLinear(x: tf.Tensor2D, blocks: LoraBlock[], scale: number, plan: BatchPlan): tf.Tensor2D {
  const { slotBlock, slotOf, rank: r, stacked } = plan;
  const u = slotBlock.length, k = blocks.length, N = x.shape[0];
  const sizes = blocks.map((bl) => bl.w.shape[0]), ws = blocks.map((bl) => bl.w);
  const cat = (parts: tf.Tensor[], axis: number) => (parts.length === 1 ? parts[0]! : tf.concat(parts, axis)) as tf.Tensor2D;
  const slots = slotCount(u, r, stacked), inF = x.shape[1];
  const layout = u > 1 ? layoutConstants(sizes, slotOf, r, scale, slots) : undefined;
  const inMasks = blocks[0]!.dropIn ? slotBlock.map((j) => blocks[j]!.dropIn!) : undefined;
  const outMasks = blocks[0]!.dropOut ? blocks.map((bl) => bl.dropOut!) : undefined;
  const operands = (as: tf.Tensor2D[], bs: tf.Tensor2D[]) => adapterOperands(as, bs, stacked ? "stacked" : `flat${slots}`, scale, () => {
    const bCat = stackRows(bs);
    const empty = slots > u ? [tf.zeros([(slots - u) * r, inF])] : [];
    // [out, 1, r] against the mask as [out, slots, r]: the broadcast places B in every slot, the mask keeps its own
    return {
      aCat: stacked ? tf.stack(as) : stackRows([...as, ...empty]), // [u, r, in] or [slots r, in]
      bd: (layout ? tf.mul(bCat.reshape([-1, 1, r]), layout.mask.reshape([-1, slots, r])).reshape([-1, slots * r]) : tf.mul(bCat, scale)) as tf.Tensor2D,
    };
  });
  // dB from dL/dBd [out, slots r]: each row keeps its own slot's r columns, times s (a gather: one
  // kernel; a masked sum over the slots took a multiply, a transpose and a reduction; a product with
  // stacked identities would round dB to 16 bits under 16-bit products, and pack and pad two operands)
  const dbsOf = (gh: tf.Tensor2D) => splitRows(layout ? tf.mul(tf.gather(gh.reshape([-1]), layout.own).reshape([-1, r]), scale) : tf.mul(gh, scale), sizes);
  // dA from dL/daCat [slots r, in]: the empty slots' rows (past u r) cut off as one piece and dropped
  const dasOf = (daCat: tf.Tensor2D) => splitRows(daCat, [...slotBlock.map(() => r), ...(slots > u ? [(slots - u) * r] : [])]).slice(0, u);
  if (!inMasks && !outMasks && mergesAdapters()) return mergedLoraLinear(x, blocks, plan, { operands, dasOf, dbsOf });
  const op = tf.customGrad((...args: GradArgs) => {
    const xs = args[0] as tf.Tensor2D, save = args[args.length - 1] as tf.GradSaveFunc;
    const as = args.slice(1, 1 + u) as tf.Tensor2D[], bs = args.slice(1 + u, 1 + u + k) as tf.Tensor2D[];
    const value = tf.tidy(() => {
      const din = inMasks && (stacked ? tf.stack(inMasks) : inMasks[0]!);
      const dout = outMasks && cat(outMasks, 1);
      const { aCat, bd } = operands(as, bs);
      let h: tf.Tensor2D;
      if (stacked) {
        const h3 = tf.matMul(tf.mul(xs, din!) as tf.Tensor3D, aCat as tf.Tensor3D, false, true); // [u, N, r]
        h = tf.transpose(h3, [1, 0, 2]).reshape([N, u * r]) as tf.Tensor2D;
      } else h = matmulT(din ? (tf.mul(xs, din) as tf.Tensor2D) : xs, aCat as tf.Tensor2D);
      const l = matmulT(h, bd);
      // the saved tensors are x, the small H, A and Bd, the masks, and the frozen weights themselves (no [N, out] copy)
      save([xs, h, aCat, bd, ...(din ? [din] : []), ...(dout ? [dout] : []), ...ws]);
      return tf.add(frozenStackProduct(xs, ws, true) ?? matmulT(xs, stackRows(ws) as tf.Tensor2D), dout ? tf.mul(l, dout) : l);
    });
    return {
      value,
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const [x0, h, aCat, bd] = saved as [tf.Tensor2D, tf.Tensor2D, tf.Tensor, tf.Tensor2D];
        let i = 4;
        const din = inMasks ? saved[i++]! : undefined, dout = outMasks ? saved[i++]! : undefined, sw = saved.slice(i) as tf.Tensor2D[];
        const g = dy as tf.Tensor2D, gl = dout ? (tf.mul(g, dout) as tf.Tensor2D) : g;
        const dh = tf.matMul(gl, bd) as tf.Tensor2D; // [N, u r]
        const dbs = dbsOf(matmulTN(gl, h)); // gl^T H [out, u r]: block j's rows against every slot's columns
        let dxa: tf.Tensor, das: tf.Tensor[];
        if (stacked) {
          const dh3 = tf.transpose(dh.reshape([N, u, r]), [1, 0, 2]) as tf.Tensor3D; // [u, N, r]
          dxa = tf.sum(tf.mul(tf.matMul(dh3, aCat as tf.Tensor3D), din!), 0);
          das = tf.unstack(tf.matMul(dh3, tf.mul(x0, din!) as tf.Tensor3D, true, false));
        } else {
          const dxd = tf.matMul(dh, aCat as tf.Tensor2D);
          dxa = din ? tf.mul(dxd, din) : dxd;
          das = dasOf(matmulTN(dh, din ? (tf.mul(x0, din) as tf.Tensor2D) : x0)); // daCat [slots r, in]
        }
        return [tf.add(frozenStackProduct(g, sw, false) ?? tf.matMul(g, stackRows(sw) as tf.Tensor2D), dxa), ...das, ...dbs];
      }),
    };
  });
  return op(x, ...slotBlock.map((j) => blocks[j]!.a!), ...blocks.map((bl) => bl.b!)) as tf.Tensor2D;
}

/**
 * Whether LoRA runs on merged weights (mergedLoraLinear): on WebGPU, where an update is bound by
 * the host's cost per dispatch, unless VERL_LORA_MERGED=0 (docs/gpu.md: merged was faster at
 * every steady step on the H100, and within the tensor cores' rounding of the unmerged form).
 */
export function mergesAdapters(): boolean {
  return parseLoraMerged(process.env.VERL_LORA_MERGED) && tf.getBackend() === "webgpu";
}

/** VERL_LORA_MERGED: 1 (or unset) merged weights on WebGPU, 0 the unmerged form; anything else is an error. */
export function parseLoraMerged(v: string | undefined): boolean {
  if (v === undefined || v === "" || v === "1") return true;
  if (v === "0") return false;
  throw new Error(`VERL_LORA_MERGED=${v}: expected 1 (LoRA on merged weights, the default on WebGPU) or 0 (the unmerged form)`);
}

/**
 * The batched form on merged weights, for a call with no dropout (WebGPU, VERL_LORA_MERGED=1):
 *   W' = W + Bd aCat                        [out, in]  once per adapter version (kept with aCat and Bd)
 *   y = x W'^T                              one product, as full fine-tuning's
 *   dx = g W',  dW' = g^T x                 as full fine-tuning's
 *   dBd = dW' aCat^T,  daCat = Bd^T dW'     on the float32 kernel (dW' keeps its range)
 * and dB, dA taken from dBd and daCat as the unmerged form takes them (own slot times s; split by
 * slot). The gradients are the unmerged form's (dL/dBd = g^T x aCat^T = g^T H); the forward sees W'
 * rounded to 16 bits where the unmerged form rounds W and adds its low-rank product separately.
 * A site's adapter work is then three kernels forward and backward where the unmerged form takes
 * about fifteen, for the full weight gradient's product, which full fine-tuning pays too.
 */
function mergedLoraLinear(x: tf.Tensor2D, blocks: LoraBlock[], plan: BatchPlan, site: {
  operands: (as: tf.Tensor2D[], bs: tf.Tensor2D[]) => AdapterOperands; dasOf: (daCat: tf.Tensor2D) => tf.Tensor[]; dbsOf: (gh: tf.Tensor2D) => tf.Tensor[];
}): tf.Tensor2D {
  const { slotBlock } = plan;
  const u = slotBlock.length, k = blocks.length, ws = blocks.map((bl) => bl.w);
  const merged = (ops: AdapterOperands): tf.Tensor2D => {
    if (ops.merged && !ops.merged.isDisposed) return ops.merged;
    const made = tf.tidy(() => {
      const w = stackRows(ws) as tf.Tensor2D;
      // W as the bias of one float32 product: the merge keeps W's bits where the adapter adds nothing
      return tf.fused.matMul({ a: ops.bd, b: ops.aCat as tf.Tensor2D, bias: w }) as tf.Tensor2D;
    });
    // kept only where the operands are (variables' adapters); a one-off call's weight goes with the op's
    // scope. Freed as soon as an adapter's data is (the step's assignment, or the model disposed): the
    // cache entry itself is replaced only by the next call, and W' is a weight's size
    if (ops.ids.length) {
      ops.merged = tf.keep(made);
      markWeightLike(made);
      const be = tf.backend() as unknown as Parameters<typeof onRelease>[0];
      for (const id of ops.ids) onRelease(be, id, () => { if (ops.merged === made) ops.merged = undefined; made.dispose(); });
    }
    return made;
  };
  const op = tf.customGrad((...args: GradArgs) => {
    const xs = args[0] as tf.Tensor2D, save = args[args.length - 1] as tf.GradSaveFunc;
    const as = args.slice(1, 1 + u) as tf.Tensor2D[], bs = args.slice(1 + u, 1 + u + k) as tf.Tensor2D[];
    const ops = site.operands(as, bs), wm = merged(ops);
    save([xs, ops.aCat, ops.bd, wm]);
    return {
      value: matmulT(xs, wm),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => tf.tidy(() => {
        const [x0, aCat, bd, w] = saved as [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D, tf.Tensor2D];
        const g = dy as tf.Tensor2D;
        const dw = matmulTN(g, x0); // [out, in]
        // dL/daCat = Bd^T dW' [slots r, in], dL/dBd = dW' aCat^T [out, slots r]
        return [tf.matMul(g, w), ...site.dasOf(float32MatMul(bd, dw, true, false)), ...site.dbsOf(float32MatMul(dw, aCat, false, true))];
      }),
    };
  });
  return op(x, ...slotBlock.map((j) => blocks[j]!.a!), ...blocks.map((bl) => bl.b!)) as tf.Tensor2D;
}

/**
 * x @ w^T. On wasm with an explicit transpose (its fast matmul path takes no transposed operand);
 * elsewhere as a transposed product: the GPU's kernels read w^T in place, where an explicit
 * transpose would copy every frozen weight on every pass.
 */
function matmulT(x: tf.Tensor2D, w: tf.Tensor2D): tf.Tensor2D {
  return onWasm() ? tf.matMul(x, t2(w)) : tf.matMul(x, w, false, true);
}

/** g^T @ x, as matmulT chooses between an explicit and an in-place transpose. */
function matmulTN(g: tf.Tensor2D, x: tf.Tensor2D): tf.Tensor2D {
  return onWasm() ? tf.matMul(t2(g), x) : tf.matMul(g, x, true, false);
}
