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
// the values with queue.writeBuffer into a storage buffer from the pool instead (llvmpipe, 64 MiB:
// 18.7 GB/s against tfjs's 1.8, bench/gpu_transfer.ts direct_upload and tfjs_upload).
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
 * `t`'s values into dst[at, at + t.size), in buckets of `bucket` values (the last shorter): one
 * promise a bucket, resolved once its values are in dst; a failed map rejects its own promise.
 * The copies are submitted before this returns, so `t` may be disposed at once. VERL_WEBGPU_DIRECT_READ=0
 * makes canReadInto false (callers then read through tfjs, for comparisons).
 */
export function readIntoBuckets(t: tf.Tensor, dst: Float32Array, at: number, bucket: number): Promise<void>[] {
  if (!canReadInto(t)) throw new Error(`readIntoBuckets: needs a float32 tensor on the webgpu backend, got ${t.dtype} on '${tf.getBackend()}'`);
  if (!(Number.isInteger(bucket) && bucket >= 1)) throw new Error(`readIntoBuckets: bucket must be a positive integer, got ${bucket}`);
  if (!(Number.isInteger(at) && at >= 0) || at + t.size > dst.length) throw new Error(`readIntoBuckets: ${t.size} values do not fit at ${at} of ${dst.length}`);
  const be = tf.backend() as unknown as TransferBackend;
  be.uploadToGPU(t.dataId);
  const src = be.tensorMap.get(t.dataId)?.resource;
  if (!src) throw new Error("readIntoBuckets: the tensor has no GPU buffer");
  be.ensureCommandEncoderReady();
  be.endComputePassEncoder();
  const pieces: { o: number; len: number; staging: Staging }[] = [];
  for (let o = 0; o < t.size; o += bucket) {
    const len = Math.min(bucket, t.size - o), staging = be.bufferManager.acquireBuffer(len * 4, MAP_READ | COPY_DST);
    be.commandEncoder.copyBufferToBuffer(src, o * 4, staging, 0, len * 4);
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

/**
 * A float32 tensor of `shape` holding `values` (copied now: the array may change afterwards). On
 * WebGPU the values go by queue.writeBuffer into a pooled storage buffer, which the queue applies
 * before any work submitted later (a pooled buffer's earlier users were all submitted before it
 * was freed); elsewhere, or with VERL_WEBGPU_DIRECT_WRITE=0, tf.tensor.
 */
export function uploadTensor(values: Float32Array, shape: number[]): tf.Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  if (n !== values.length) throw new Error(`uploadTensor: ${values.length} values for shape [${shape}]`);
  if (!canWriteDirect() || n === 0) return tf.tensor(values.slice(), shape, "float32");
  const be = tf.backend() as unknown as TransferBackend;
  const info = be.makeTensorInfo(shape, "float32");
  be.uploadToGPU(info.dataId); // no values: a pooled storage buffer, nothing written
  const buffer = be.tensorMap.get(info.dataId)!.resource, queue = be.device.queue;
  if (stagingCapBytes() > 0) uploadStaged(be, values, buffer);
  else if (values.buffer instanceof ArrayBuffer) queue.writeBuffer(buffer, 0, values);
  else {
    // dawn.node refused views of the ranks' shared regions in pool threads ("Invalid argument"; a
    // plain SharedArrayBuffer in the main thread went): through a reused plain array, in chunks
    // (writeBuffer copies at the call, so the chunk is free again at once)
    for (let o = 0; o < n; o += SCRATCH_ELEMS) {
      const len = Math.min(SCRATCH_ELEMS, n - o);
      scratch ??= new Float32Array(SCRATCH_ELEMS);
      scratch.set(values.subarray(o, o + len));
      queue.writeBuffer(buffer, o * 4, scratch.subarray(0, len));
    }
  }
  return tf.engine().makeTensorFromTensorInfo(info as Parameters<ReturnType<typeof tf.engine>["makeTensorFromTensorInfo"]>[0]);
}

// Uploads through kept staging (VERL_WEBGPU_UPLOAD_STAGING_MB > 0). On the H100 every upload path
// above ran at 1.4-1.7 GB/s (bench/gpu_transfer.ts, 2026-12-07): each takes staging memory the
// host has not touched before (writeBuffer's own, or a buffer mapped at creation), and a first
// touch costs about what a 716 MB shared buffer's did here (580 ms). These MAP_WRITE buffers are
// kept: after their copy each is mapped again, and the next upload writes into memory already
// mapped in. At most the cap's worth is made; past it, or while none is mapped again yet, a chunk
// goes by writeBuffer as before.
const STAGING_CHUNK = 16 << 20;
const stagingReady: Staging[] = [];
let stagingMade = 0;

function stagingCapBytes(): number {
  const mb = Number(process.env.VERL_WEBGPU_UPLOAD_STAGING_MB ?? 0);
  return Number.isFinite(mb) && mb > 0 ? mb * 2 ** 20 : 0;
}

/** values into `buffer` from offset 0: a kept staging buffer a chunk where one is free, copied in tfjs's command stream. */
function uploadStaged(be: TransferBackend, values: Float32Array, buffer: unknown): void {
  be.ensureCommandEncoderReady();
  be.endComputePassEncoder();
  const used: Staging[] = [];
  const chunk = STAGING_CHUNK / 4;
  for (let o = 0; o < values.length; o += chunk) {
    const len = Math.min(chunk, values.length - o), piece = values.subarray(o, o + len);
    let staging = stagingReady.pop();
    if (!staging && stagingMade + STAGING_CHUNK <= stagingCapBytes()) {
      staging = be.device.createBuffer({ size: STAGING_CHUNK, usage: MAP_WRITE | COPY_SRC, mappedAtCreation: true });
      stagingMade += STAGING_CHUNK;
    }
    if (!staging) {
      // none free: as before (a view of shared memory through the scratch, see uploadTensor)
      if (piece.buffer instanceof ArrayBuffer) be.device.queue.writeBuffer(buffer, o * 4, piece);
      else {
        scratch ??= new Float32Array(SCRATCH_ELEMS);
        scratch.set(piece);
        be.device.queue.writeBuffer(buffer, o * 4, scratch.subarray(0, len));
      }
      continue;
    }
    new Float32Array(staging.getMappedRange(0, len * 4)).set(piece);
    staging.unmap();
    be.commandEncoder.copyBufferToBuffer(staging, 0, buffer, o * 4, len * 4);
    used.push(staging);
  }
  if (used.length === 0) return;
  be.submitQueue();
  for (const staging of used) {
    staging.mapAsync(MODE_WRITE).then(() => void stagingReady.push(staging), () => {
      // a device lost or torn down: the buffer is gone, and with it its share of the cap
      stagingMade -= STAGING_CHUNK;
      staging.destroy?.();
    });
  }
}

/** Kept staging buffers: how many bytes were made, and how many are mapped and free now (for tests). */
export function uploadStagingStats(): { madeBytes: number; readyBuffers: number } {
  return { madeBytes: stagingMade, readyBuffers: stagingReady.length };
}
