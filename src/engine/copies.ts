// Tensors laid end to end, or cut apart, along their first axis by buffer copies on WebGPU
// (issue 23). Both are contiguous byte ranges, so a copy on the command encoder does what tf.concat
// and tf.split (tf.slice) do with a dispatch each: the host pays one Dawn call a part, where a
// dispatch costs a program, uniforms and a bind group. Users: the optimizer's flat vectors (one
// piece a variable, ~290 at the 0.5B shape) and the model's stacked weights (q/k/v's and gate/up's
// fused products, LoRA's stacked A and B). Each kernel has a registered gradient (the other one),
// so stacks inside a training pass differentiate. Elsewhere, or with VERL_FLAT_BY_COPIES=0, tfjs's
// own concat and split run (for comparisons).
import * as tf from "@tensorflow/tfjs";
import { registerWebGPUKernels, type Kernel, type TensorInfo } from "./webgpu_fused.js";
import { envSwitch } from "../utils/env_switch.js";

const size = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/** The tfjs WebGPU backend's members the split by copies uses (tfjs-backend-webgpu 4.22). */
interface CopyBackend {
  makeTensorInfo(shape: number[], dtype: string, values?: number[]): TensorInfo;
  uploadToGPU(dataId: object): void;
  tensorMap: { get(dataId: object): { resource?: unknown } | undefined };
  ensureCommandEncoderReady(): void;
  endComputePassEncoder(): void;
  commandEncoder: { copyBufferToBuffer(src: unknown, srcOffset: number, dst: unknown, dstOffset: number, size: number): void };
  commandQueueOwnedIds: WeakSet<object>;
}

/**
 * flat split into pieces of `sizes` values by buffer copies on the command encoder: one copy a
 * piece, not a slice dispatch (the optimizer's new parameters: one piece a variable, ~290 at the
 * 0.5B shape). A copy costs the host one Dawn call, where a dispatch costs a program, uniforms and
 * a bind group. The pieces and flat are marked as owned by the unsubmitted commands, as tfjs marks
 * a dispatch's, so neither buffer is handed out again before the copies run. The pieces start at
 * value `begin` (default 0) and need not cover the rest of flat.
 */
const splitByCopies = (({ inputs: { x }, backend, attrs }: { inputs: Record<string, TensorInfo>; backend: unknown; attrs: Record<string, unknown> }) => {
  const be = backend as CopyBackend, sizes = attrs.sizes as number[], begin = (attrs.begin as number | undefined) ?? 0;
  be.uploadToGPU(x!.dataId);
  const src = be.tensorMap.get(x!.dataId)!.resource;
  be.ensureCommandEncoderReady();
  be.endComputePassEncoder();
  be.commandQueueOwnedIds.add(x!.dataId);
  let at = begin;
  return sizes.map((n) => {
    // an empty piece holds no buffer (as tfjs's slice makes it)
    const out = be.makeTensorInfo([n], "float32", n > 0 ? undefined : []);
    if (n > 0) {
      be.uploadToGPU(out.dataId);
      be.commandEncoder.copyBufferToBuffer(src, 4 * at, be.tensorMap.get(out.dataId)!.resource, 0, 4 * n);
      be.commandQueueOwnedIds.add(out.dataId);
    }
    at += n;
    return out;
  });
}) as unknown as Kernel;

/**
 * The inputs (x0, x1, ... in that order, any shapes) laid end to end in one new flat vector by
 * buffer copies: the flat gradient and parameter vectors of the optimizer, where tf.concat takes
 * a dispatch per handful of inputs and a second level for their results.
 */
const concatByCopies = (({ inputs, backend }: { inputs: Record<string, TensorInfo>; backend: unknown }) => {
  const be = backend as CopyBackend, xs = Object.keys(inputs).map((_, i) => inputs[`x${i}`]!);
  const sizes = xs.map((x) => size(x.shape)), total = sizes.reduce((a, b) => a + b, 0);
  const out = be.makeTensorInfo([total], "float32", total > 0 ? undefined : []);
  if (total === 0) return out;
  be.uploadToGPU(out.dataId);
  const dst = be.tensorMap.get(out.dataId)!.resource;
  const sources = xs.map((x, i) => {
    if (sizes[i]! > 0) be.uploadToGPU(x.dataId); // a tensor still on the host (zeros for a missing gradient) goes up first
    return be.tensorMap.get(x.dataId)!.resource;
  });
  be.ensureCommandEncoderReady();
  be.endComputePassEncoder();
  let at = 0;
  xs.forEach((x, i) => {
    const n = sizes[i]!;
    if (n > 0) {
      be.commandEncoder.copyBufferToBuffer(sources[i], 0, dst, 4 * at, 4 * n);
      be.commandQueueOwnedIds.add(x.dataId);
    }
    at += n;
  });
  be.commandQueueOwnedIds.add(out.dataId);
  return out;
}) as unknown as Kernel;

let registered = false;
function ensureRegistered(): void {
  if (registered) return;
  registered = true;
  registerWebGPUKernels({ VerlSplitByCopies: splitByCopies, VerlConcatByCopies: concatByCopies });
  // the gradient of one is the other: the pieces' gradients laid end to end (zeros around pieces
  // that do not cover the whole), or each input's range of the whole's gradient copied out
  // (reshaped to the input's shape; only the inputs that need one ask)
  tf.registerGradient({
    kernelName: "VerlSplitByCopies",
    gradFunc: (dy: tf.Tensor | tf.Tensor[], _saved: tf.Tensor[], attrs: tf.NamedAttrMap) => {
      const dys = dy as tf.Tensor[], begin = (attrs.begin as number | undefined) ?? 0, total = attrs.total as number;
      const rest = total - begin - dys.reduce((a, d) => a + d.size, 0);
      return { x: () => concatFlat([...(begin > 0 ? [tf.zeros([begin])] : []), ...dys, ...(rest > 0 ? [tf.zeros([rest])] : [])]) };
    },
  });
  tf.registerGradient({
    kernelName: "VerlConcatByCopies",
    gradFunc: (dy: tf.Tensor | tf.Tensor[], _saved: tf.Tensor[], attrs: tf.NamedAttrMap) => {
      const shapes = attrs.shapes as number[][], flat = (dy as tf.Tensor).reshape([-1]);
      let begin = 0;
      return Object.fromEntries(shapes.map((shape, i) => {
        const at = begin, n = size(shape);
        begin += n;
        return [`x${i}`, () => (tf.engine().runKernel("VerlSplitByCopies", { x: flat }, { sizes: [n], begin: at, total: flat.size }) as unknown as tf.Tensor[])[0]!.reshape(shape)];
      }));
    },
  });
}

/**
 * Whether tensors are concatenated and split by buffer copies here (WebGPU, float32;
 * VERL_FLAT_BY_COPIES=0: tf.concat's and tf.split's dispatches, for comparisons).
 */
export function flatByCopies(xs: tf.Tensor[]): boolean {
  if (!envSwitch("VERL_FLAT_BY_COPIES", true) || tf.getBackend() !== "webgpu" || xs.some((x) => x.dtype !== "float32")) return false;
  ensureRegistered();
  return true;
}

/** A flat float32 vector split into pieces of `sizes` values (1-D; the caller reshapes): buffer copies on WebGPU. */
export function splitFlat(flat: tf.Tensor1D, sizes: number[]): tf.Tensor1D[] {
  const total = sizes.reduce((a, b) => a + b, 0);
  if (total !== flat.size) throw new Error(`splitFlat: pieces of ${total} values in all, the vector has ${flat.size}`);
  if (!flatByCopies([flat])) return tf.split(flat, sizes) as tf.Tensor1D[];
  return tf.engine().runKernel("VerlSplitByCopies", { x: flat }, { sizes, begin: 0, total }) as unknown as tf.Tensor1D[];
}

/** Float32 tensors of any shapes flattened and laid end to end: buffer copies on WebGPU, else tf.concat. */
export function concatFlat(xs: tf.Tensor[]): tf.Tensor1D {
  if (xs.length === 0) throw new Error("concatFlat: nothing to concatenate");
  if (!flatByCopies(xs)) return tf.concat(xs.map((x) => x.reshape([-1]))) as tf.Tensor1D;
  return tf.engine().runKernel("VerlConcatByCopies", Object.fromEntries(xs.map((x, i) => [`x${i}`, x])), { shapes: xs.map((x) => x.shape) }) as tf.Tensor1D;
}

/** Throws unless every part has the same extents past the first axis. */
function checkTails(what: string, parts: readonly { shape: number[] }[]): number[] {
  const tail = parts[0]!.shape.slice(1);
  if (parts.some((p) => p.shape.length !== tail.length + 1 || p.shape.slice(1).join() !== tail.join())) {
    throw new Error(`${what}: parts must agree past their first axis, got ${parts.map((p) => `[${p.shape}]`).join(", ")}`);
  }
  return tail;
}

/**
 * tf.concat(parts, 0): weights or biases stacked along their first axis for one fused product
 * (q/k/v, gate/up, LoRA's A and B), by buffer copies on WebGPU. A single part is returned as is.
 */
export function stackRows(parts: tf.Tensor[]): tf.Tensor {
  if (parts.length === 0) throw new Error("stackRows: nothing to stack");
  if (parts.length === 1) return parts[0]!;
  const tail = checkTails("stackRows", parts);
  if (!flatByCopies(parts)) return tf.concat(parts, 0);
  return concatFlat(parts).reshape([parts.reduce((a, p) => a + p.shape[0]!, 0), ...tail]);
}

/** tf.split(x, rows, 0): x cut along its first axis into pieces of `rows`, by buffer copies on WebGPU. */
export function splitRows(x: tf.Tensor, rows: number[]): tf.Tensor[] {
  const total = rows.reduce((a, b) => a + b, 0);
  if (x.rank < 1 || total !== x.shape[0]) throw new Error(`splitRows: pieces of ${total} rows in all, the tensor is [${x.shape}]`);
  if (rows.length === 1) return [x];
  if (!flatByCopies([x])) return tf.split(x, rows, 0);
  const tail = x.shape.slice(1), width = size(tail);
  return splitFlat(x.reshape([-1]) as tf.Tensor1D, rows.map((r) => r * width)).map((p, i) => p.reshape([rows[i]!, ...tail]));
}
