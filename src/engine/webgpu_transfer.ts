// Host arrays to and from the GPU without tfjs's extra steps (issue 23, two ranks: the flat
// gradient's and parameters' round trip through the host).
//
// Read-back: a float32 tensor straight into a host array, bucket by bucket. tfjs's `data()` per bucket costs a
// slice dispatch (the bucket's own tensor), a submit, a map, a copy of the mapped bytes into a new
// ArrayBuffer (`getMappedRange().slice(0)`), and the caller's copy of that into the rank's shared
// region: the gradient crossed host memory twice. Here every bucket is one buffer copy into a
// staging buffer from tfjs's pool (MAP_READ, kept across steps by size), all in one submit; each
// bucket's promise resolves once its mapped bytes are copied into `dst` at its place: one crossing,
// no dispatch. `bench/gpu_transfer.ts` times both ways (llvmpipe, 64 MiB: tfjs 2.45 GB/s plus the
// copy-in, the direct path 8.6 GB/s).
//
// Upload: tfjs puts a tensor made from host values into a MAP_WRITE staging buffer it creates for
// that upload alone (mapped at creation, never reused), then copies it over. `uploadTensor` writes
// the values into a storage buffer from the pool instead, through kept MAP_WRITE staging (below;
// H100, 256 MiB: 5.7 GB/s against tfjs's 1.6) or queue.writeBuffer (llvmpipe, 64 MiB: 18.7 GB/s
// against tfjs's 1.8; bench/gpu_transfer.ts staged_upload, direct_upload and tfjs_upload).
import * as tf from "@tensorflow/tfjs";

const MAP_READ = 0x1, MAP_WRITE = 0x2, COPY_SRC = 0x4, COPY_DST = 0x8, MODE_READ = 0x1, MODE_WRITE = 0x2;

interface Staging { size: number; mapAsync(mode: number): Promise<void>; getMappedRange(offset?: number, size?: number): ArrayBuffer; unmap(): void; destroy?(): void }

/** The tfjs WebGPU backend's members this uses (tfjs-backend-webgpu 4.22). */
interface TransferBackend {
  uploadToGPU(dataId: object): void;
  tensorMap: { get(dataId: object): { resource?: unknown } | undefined };
  ensureCommandEncoderReady(): void;
  endComputePassEncoder(): void;
  submitQueue(): void;
  commandEncoder: { copyBufferToBuffer(src: unknown, srcOffset: number, dst: unknown, dstOffset: number, size: number): void };
  bufferManager: { acquireBuffer(size: number, usage: number): Staging; releaseBuffer(b: Staging): void };
  makeTensorInfo(shape: number[], dtype: string): { dataId: object; shape: number[]; dtype: string };
  device: {
    queue: { writeBuffer(buffer: unknown, offset: number, data: ArrayBufferView): void };
    createBuffer(d: { size: number; usage: number; mappedAtCreation?: boolean }): Staging;
  };
}

/** Whether readIntoBuckets can read `t` here (the WebGPU backend, float32). */
export function canReadInto(t: tf.Tensor): boolean {
  return tf.getBackend() === "webgpu" && t.dtype === "float32" && process.env.VERL_WEBGPU_DIRECT_READ !== "0";
}

/**
 * `t`'s values [from, to) (default all of them) into dst[at, at + to - from), in buckets of `bucket`
 * values (the last shorter): one promise a bucket, resolved once its values are in dst; a failed map
 * rejects its own promise.
 * The copies are submitted before this returns, so `t` may be disposed at once. VERL_WEBGPU_DIRECT_READ=0
 * makes canReadInto false (callers then read through tfjs, for comparisons).
 */
export function readIntoBuckets(t: tf.Tensor, dst: Float32Array, at: number, bucket: number, from = 0, to = t.size): Promise<void>[] {
  if (!canReadInto(t)) throw new Error(`readIntoBuckets: needs a float32 tensor on the webgpu backend, got ${t.dtype} on '${tf.getBackend()}'`);
  if (!(Number.isInteger(bucket) && bucket >= 1)) throw new Error(`readIntoBuckets: bucket must be a positive integer, got ${bucket}`);
  if (!(Number.isInteger(from) && Number.isInteger(to) && 0 <= from && from <= to && to <= t.size)) throw new Error(`readIntoBuckets: [${from}, ${to}) is not a range of the tensor's ${t.size} values`);
  const size = to - from;
  if (!(Number.isInteger(at) && at >= 0) || at + size > dst.length) throw new Error(`readIntoBuckets: ${size} values do not fit at ${at} of ${dst.length}`);
  const be = tf.backend() as unknown as TransferBackend;
  be.uploadToGPU(t.dataId);
  const src = be.tensorMap.get(t.dataId)?.resource;
  if (!src) throw new Error("readIntoBuckets: the tensor has no GPU buffer");
  be.ensureCommandEncoderReady();
  be.endComputePassEncoder();
  const pieces: { o: number; len: number; staging: Staging }[] = [];
  for (let o = 0; o < size; o += bucket) {
    const len = Math.min(bucket, size - o), staging = be.bufferManager.acquireBuffer(len * 4, MAP_READ | COPY_DST);
    be.commandEncoder.copyBufferToBuffer(src, (from + o) * 4, staging, 0, len * 4);
    pieces.push({ o, len, staging });
  }
  be.submitQueue();
  const reads = pieces.map(async ({ o, len, staging }) => {
    try {
      await staging.mapAsync(MODE_READ);
      dst.set(new Float32Array(staging.getMappedRange(), 0, len), at + o);
      staging.unmap();
    } finally {
      be.bufferManager.releaseBuffer(staging);
    }
  });
  // a caller that fails half-way leaves the rest unread: not an unhandled rejection
  for (const p of reads) p.catch(() => undefined);
  return reads;
}

const SCRATCH_ELEMS = 4 << 20; // 16 MiB
let scratch: Float32Array | undefined;

/** Whether uploadTensor writes directly here (the WebGPU backend; VERL_WEBGPU_DIRECT_WRITE=0: through tfjs). */
export function canWriteDirect(): boolean {
  return tf.getBackend() === "webgpu" && process.env.VERL_WEBGPU_DIRECT_WRITE !== "0";
}

/** values into `buffer` at element `at` by queue.writeBuffer. */
function writeValues(be: TransferBackend, buffer: unknown, at: number, values: Float32Array): void {
  if (values.buffer instanceof ArrayBuffer) return be.device.queue.writeBuffer(buffer, at * 4, values);
  // dawn.node refused views of the ranks' shared regions in pool threads ("Invalid argument"; a
  // plain SharedArrayBuffer in the main thread went): through a reused plain array, in chunks
  // (writeBuffer copies at the call, so the chunk is free again at once)
  for (let o = 0; o < values.length; o += SCRATCH_ELEMS) {
    const len = Math.min(SCRATCH_ELEMS, values.length - o);
    scratch ??= new Float32Array(SCRATCH_ELEMS);
    scratch.set(values.subarray(o, o + len));
    be.device.queue.writeBuffer(buffer, (at + o) * 4, scratch.subarray(0, len));
  }
}

/**
 * A float32 tensor of `shape` holding `values` (copied now: the array may change afterwards). On
 * WebGPU the values go into a pooled storage buffer through kept staging (copies in tfjs's command
 * stream) or by queue.writeBuffer (which the queue applies before any work submitted later: a
 * pooled buffer's earlier users were all submitted before it was freed); elsewhere, or with
 * VERL_WEBGPU_DIRECT_WRITE=0, tf.tensor.
 */
export function uploadTensor(values: Float32Array, shape: number[]): tf.Tensor {
  const n = tf.util.sizeFromShape(shape);
  if (n !== values.length) throw new Error(`uploadTensor: ${values.length} values for shape [${shape}]`);
  if (!canWriteDirect() || n === 0) return tf.tensor(values.slice(), shape, "float32");
  const be = tf.backend() as unknown as TransferBackend;
  const info = be.makeTensorInfo(shape, "float32");
  be.uploadToGPU(info.dataId); // no values: a pooled storage buffer, nothing written
  const buffer = be.tensorMap.get(info.dataId)!.resource;
  if (stagingCapBytes() > 0) uploadStaged(be, values, buffer);
  else writeValues(be, buffer, 0, values);
  return tf.engine().makeTensorFromTensorInfo(info as Parameters<ReturnType<typeof tf.engine>["makeTensorFromTensorInfo"]>[0]);
}

// Uploads through kept staging (VERL_WEBGPU_UPLOAD_STAGING_MB, default 1024; 0: off). On the
// H100 every other upload path ran at 0.9-1.6 GB/s (bench/gpu_transfer.ts, 2026-12-07), writeBuffer
// into a kept destination too: each takes staging memory the host has not touched before
// (writeBuffer's own, or a buffer mapped at creation). These MAP_WRITE buffers are kept: after
// their copy each is mapped again, and the next upload writes into memory already mapped in
// (64-256 MiB: 4.9-5.7 GB/s against writeBuffer's 1.2-1.3). Buffers come in power-of-two sizes
// from 1 to 16 MiB (a larger upload goes in 16 MiB chunks), so a parameter of a few MiB does not
// hold a whole chunk. At most the cap's worth is made; past it, while none of the size is mapped
// again yet, or for a piece under 256 KiB, writeBuffer as before.
const STAGING_MAX = 16 << 20, STAGING_MIN = 1 << 20, STAGING_SMALL = 256 << 10;
const stagingReady = new Map<number, Staging[]>();
let stagingMade = 0;

function stagingCapBytes(): number {
  const mb = Number(process.env.VERL_WEBGPU_UPLOAD_STAGING_MB ?? 1024);
  return Number.isFinite(mb) && mb > 0 ? mb * 2 ** 20 : 0;
}

let stagingDevice: unknown;

/** A kept staging buffer of `bytes` (a size class) mapped and free, or a new one under the cap, or none. */
function takeStaging(be: TransferBackend, bytes: number): Staging | undefined {
  if (stagingDevice !== be.device) {
    // a new device (a backend made again in this thread): the old one's buffers are not for it
    stagingReady.clear();
    stagingMade = 0;
    stagingDevice = be.device;
  }
  const free = stagingReady.get(bytes)?.pop();
  if (free || stagingMade + bytes > stagingCapBytes()) return free;
  stagingMade += bytes;
  return be.device.createBuffer({ size: bytes, usage: MAP_WRITE | COPY_SRC, mappedAtCreation: true });
}

/** values into `buffer` from offset 0: kept staging a chunk where one is free, copied in tfjs's command stream. */
function uploadStaged(be: TransferBackend, values: Float32Array, buffer: unknown): void {
  be.ensureCommandEncoderReady();
  be.endComputePassEncoder();
  const used: Staging[] = [];
  for (let o = 0; o < values.length; o += STAGING_MAX / 4) {
    const len = Math.min(STAGING_MAX / 4, values.length - o), piece = values.subarray(o, o + len);
    let size = STAGING_MIN;
    while (size < len * 4) size *= 2;
    const staging = len * 4 >= STAGING_SMALL ? takeStaging(be, size) : undefined;
    if (!staging) {
      writeValues(be, buffer, o, piece);
      continue;
    }
    new Float32Array(staging.getMappedRange(0, len * 4)).set(piece);
    staging.unmap();
    be.commandEncoder.copyBufferToBuffer(staging, 0, buffer, o * 4, len * 4);
    used.push(staging);
  }
  if (used.length === 0) return;
  be.submitQueue();
  const device = be.device;
  for (const staging of used) {
    staging.mapAsync(MODE_WRITE).then(() => {
      if (stagingDevice !== device) return void staging.destroy?.(); // its device was replaced meanwhile
      const list = stagingReady.get(staging.size) ?? [];
      list.push(staging);
      stagingReady.set(staging.size, list);
    }, () => {
      // a device lost or torn down: the buffer is gone, and with it its share of the cap
      if (stagingDevice === device) stagingMade -= staging.size;
      staging.destroy?.();
    });
  }
}

/** Kept staging: the bytes made, and the buffers (and their bytes) mapped and free now; all made are free once the copies are done. */
export function uploadStagingStats(): { madeBytes: number; readyBuffers: number; readyBytes: number } {
  let readyBuffers = 0, readyBytes = 0;
  for (const [size, list] of stagingReady) { readyBuffers += list.length; readyBytes += size * list.length; }
  return { madeBytes: stagingMade, readyBuffers, readyBytes };
}
