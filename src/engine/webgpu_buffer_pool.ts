// A bound on tfjs-backend-webgpu's pool of released GPU buffers.
//
// tfjs keeps every buffer a disposed tensor releases in a free list keyed by its exact byte size
// and usage, and never destroys one (BufferManager in tfjs-backend-webgpu 4.22). Work whose
// shapes change from call to call then keeps one dead buffer for every size it ever met: the
// agent loop's slot decoder (a different number of tokens each call) and the packed micro-batches
// of remove-padding (a different token total each micro-batch). Verl's multi-turn GSM8K example
// at Qwen2.5-0.5B's shape ran the H200's 141 GB out of memory that way within its first step
// (2026-12-04, bench/gpu_multiturn_export_session.sh). Here, when a buffer of a size with no free
// one must be created and the free lists hold more than the cap, the buffers parked longest are
// destroyed until half the cap is left: sizes met once (the shapes that changed) sit at the old
// end, while the sizes every step asks for again are parked only briefly and stay, so fixed-shape
// work keeps its reuse. Destroying is safe for buffers already handed to the queue: WebGPU frees
// them once the submitted work that uses them is done, and tfjs returns a buffer to the pool only
// after the commands recorded with it were submitted.

// Size classes (VERL_WEBGPU_SIZE_CLASSES, on unless "0"). The free lists match an exact byte size,
// so micro-batches of varying token totals (remove-padding, dynamic batch size) met a new size for
// most activations every micro-batch and created a buffer for each (issue 23: createBuffer ~24% of
// the host time of the 0.5B update on the H200). A storage buffer's size is rounded up to a class:
// above SIZE_CLASS_MIN_BYTES (256) the next multiple of 1/8 of the power of two at or below it (waste
// < 12.5% of the buffer), so nearby token totals share parked buffers. Audit of tfjs-backend-webgpu
// 4.22 (dist/backend_webgpu.js, buffer_manager.js) for uses of a GPUBuffer's size, each safe as
// handled here:
// - BufferManager.releaseBuffer keys by buffer.size and numBytesUsed/-Allocated count it: the size
//   handed to tfjs's acquireBuffer is the rounded one, so its keys and counts stay consistent.
// - bind groups bind the whole buffer ({ buffer: resource }, no size); tfjs's shaders and ours
//   (src/engine, src/rollout) never use arrayLength(): they index by the shapes in the uniforms,
//   so the tail past a tensor's bytes is never read or written.
// - uniform buffers (makeUniforms: size and writeBuffer of the exact uniform bytes) are UNIFORM
//   usage: never rounded. Staging buffers (MAP_WRITE uploads, MAP_READ read-backs, the query
//   set's resolve/read) have MAP_* usage: never rounded (a read-back's staging takes the size of
//   the buffer it copies, which may be a class size: harmless).
// - uploadToGPU: mappedAtCreation buffer or staging copy of `size` exact bytes into a buffer at
//   least that large; the mapped range is written from offset 0 with the tensor's values only.
// - getBufferData (read/data()) copies and maps buffer.size bytes and returns all of them, which
//   would give a longer typed array: exactReadBack below cuts it to the bytes acquired (recorded
//   per buffer). readSync (OffscreenCanvas, browsers only) uses buffer.size too: not reachable in
//   Node, where it throws before reading.
// - copyBuffer (createTensorFromGPUData without zeroCopy) and readToGPU (dataToGPU) copy
//   srcBuffer.size into a buffer acquired with that size: the copy's real size is carried over by
//   exactReadBack. createTensorFromGPUData checks buffer.size >= the tensor's bytes: still true.
// Results are bit-identical (same kernels, same uniforms, same bytes read back).

import { spawnSync } from "node:child_process";
import { envSwitch } from "../utils/env_switch.js";

/** The parts of tfjs-backend-webgpu's BufferManager this relies on (checked at install). */
interface BufferManagerLike {
  freeBuffers: Map<string, GpuBufferLike[]>;
  numFreeBuffers: number;
  numBytesAllocated: number;
  numBytesUsed: number;
  acquireBuffer(size: number, usage: number, mappedAtCreation?: boolean, reuse?: boolean): unknown;
  releaseBuffer(buffer: GpuBufferLike, reuse?: boolean): void;
}

interface GpuBufferLike { size: number; usage: number; destroy(): void }

/**
 * Cap on the bytes parked in the free lists where the GPU's memory is unknown (VERL_WEBGPU_FREE_POOL_MB
 * overrides any default).
 */
export const DEFAULT_FREE_POOL_MB = 4096;

/**
 * Where the GPU's memory is known (and VERL_WEBGPU_FREE_POOL_MB unset) there is no cap on the free
 * lists but a budget on everything the manager holds, used and free: this share of the rank's part
 * of the GPU. A new buffer that would pass it first destroys the buffers parked longest, only as
 * many bytes as it needs. A training step frees and asks again for tens of GB between its
 * micro-batches and around the optimizer, so a cap on the free lists alone destroyed and re-made
 * them every step: on an H100 (80 GB) the 0.5B full fine-tuning update at 64 x 96 tokens made
 * 27 GB of buffers an update under the former default cap (half the GPU), 1.2-1.8 s an update,
 * against none and 0.37 s with 64 GiB (bench/gpu_decode.ts, 2026-12-07; docs/gpu.md). The rest of
 * the GPU is for what tfjs's manager does not hold (packed weights, staging, Dawn's own).
 */
export const POOL_BUDGET_SHARE_OF_GPU = 0.8;

/** What bounds the pool: free bytes (capBytes; trimmed to half when passed) and bytes held in all (budgetBytes). */
export interface FreePoolLimits { capBytes: number; budgetBytes: number }

export interface FreePoolStats {
  trims: number; bytesDestroyed: number; capBytes: number; budgetBytes: number;
  /** buffers created (no free one of the size was parked) and their bytes: the churn a too-small cap causes */
  created: number; bytesCreated: number;
}

const installed = new WeakMap<object, FreePoolStats>();

/** Up to this many bytes a storage buffer keeps its exact size (scalars and short vectors, whose sizes rarely vary; a per-token vector of 64+ fp32 tokens gets classes). */
export const SIZE_CLASS_MIN_BYTES = 256;

const GPU_MAP_READ = 0x1, GPU_MAP_WRITE = 0x2, GPU_UNIFORM = 0x40, GPU_STORAGE = 0x80;

/** Whether size classes are on: VERL_WEBGPU_SIZE_CLASSES unset or "1" (on), "0" (off). */
export function sizeClassesEnabled(env: string | undefined = process.env.VERL_WEBGPU_SIZE_CLASSES): boolean {
  return envSwitch("VERL_WEBGPU_SIZE_CLASSES", true, env);
}

/**
 * The size class of `size` bytes: itself up to SIZE_CLASS_MIN_BYTES, else the next multiple of
 * 1/8 of the largest power of two <= size (at most 12.5% more; a class size maps to itself).
 */
export function sizeClass(size: number): number {
  if (size <= SIZE_CLASS_MIN_BYTES) return size;
  const step = 2 ** Math.floor(Math.log2(size)) / 8;
  return Math.ceil(size / step) * step;
}

/** Only storage buffers that are neither mapped nor uniform are rounded (see the audit above). */
function roundable(usage: number): boolean {
  return (usage & GPU_STORAGE) !== 0 && (usage & (GPU_MAP_READ | GPU_MAP_WRITE | GPU_UNIFORM)) === 0;
}

/** The bytes each rounded buffer was last acquired for (its tensor's bytes). */
const acquiredBytes = new WeakMap<object, number>();

/**
 * The pool's limits: VERL_WEBGPU_FREE_POOL_MB (a number of MiB >= 0) caps the free lists when set;
 * else a budget of POOL_BUDGET_SHARE_OF_GPU of `gpuBytes` when known; else DEFAULT_FREE_POOL_MB of
 * free lists.
 */
export function freePoolLimits(env: string | undefined = process.env.VERL_WEBGPU_FREE_POOL_MB, gpuBytes?: number): FreePoolLimits {
  if (env === undefined || env === "") {
    return gpuBytes !== undefined && gpuBytes > 0
      ? { capBytes: Infinity, budgetBytes: Math.floor(gpuBytes * POOL_BUDGET_SHARE_OF_GPU) }
      : { capBytes: DEFAULT_FREE_POOL_MB * 2 ** 20, budgetBytes: Infinity };
  }
  const mb = Number(env);
  if (!Number.isFinite(mb) || mb < 0) throw new Error(`VERL_WEBGPU_FREE_POOL_MB must be a number of MiB >= 0, got '${env}'`);
  return { capBytes: Math.floor(mb * 2 ** 20), budgetBytes: Infinity };
}

/**
 * The smallest total memory nvidia-smi reports over the host's GPUs, in bytes; undefined where
 * there is no nvidia-smi or it fails (WebGPU does not tell an adapter's memory).
 */
export function nvidiaGpuMemoryBytes(run: () => string | null = nvidiaSmiMemory): number | undefined {
  const out = run();
  if (!out) return undefined;
  const mib = out.split("\n").map((l) => Number(l.trim())).filter((x) => Number.isFinite(x) && x > 0);
  return mib.length ? Math.min(...mib) * 2 ** 20 : undefined;
}

function nvidiaSmiMemory(): string | null {
  const r = spawnSync("nvidia-smi", ["--query-gpu=memory.total", "--format=csv,noheader,nounits"], { encoding: "utf8", timeout: 5000 });
  return r.status === 0 && typeof r.stdout === "string" ? r.stdout : null;
}

/**
 * Destroys parked buffers, the longest parked first (`parkedAt` gives each one's release order),
 * until at most `keepBytes` stay parked; the keys stay (tfjs's releaseBuffer expects them).
 * Returns the bytes freed.
 */
export function trimFreeBuffers(manager: BufferManagerLike, keepBytes = 0, parkedAt: WeakMap<object, number> = new WeakMap()): number {
  const parked: { list: GpuBufferLike[]; b: GpuBufferLike; at: number }[] = [];
  for (const list of manager.freeBuffers.values()) for (const b of list) parked.push({ list, b, at: parkedAt.get(b) ?? -1 });
  parked.sort((x, y) => x.at - y.at);
  let free = manager.numBytesAllocated - manager.numBytesUsed, bytes = 0;
  for (const { list, b } of parked) {
    if (free <= keepBytes) break;
    list.splice(list.indexOf(b), 1);
    b.destroy();
    manager.numFreeBuffers--;
    free -= b.size;
    bytes += b.size;
  }
  manager.numBytesAllocated -= bytes;
  return bytes;
}

/**
 * Wraps the manager's acquireBuffer and releaseBuffer so that, when a new buffer is created, the
 * free lists hold no more than `limits.capBytes` (trimmed to half the cap, oldest first) and the
 * manager no more than `limits.budgetBytes` with the new buffer (the oldest parked destroyed until
 * it fits, or none is left). A number is a cap on the free lists alone. Idempotent per manager;
 * returns the live statistics.
 */
export function capFreeBufferPool(manager: BufferManagerLike, limits: FreePoolLimits | number = freePoolLimits(), sizeClasses = sizeClassesEnabled()): FreePoolStats {
  const { capBytes, budgetBytes } = typeof limits === "number" ? { capBytes: limits, budgetBytes: Infinity } : limits;
  const have = installed.get(manager);
  if (have) return have;
  for (const k of ["freeBuffers", "numBytesAllocated", "numBytesUsed", "acquireBuffer", "releaseBuffer"] as const) {
    if (!(k in manager)) throw new Error(`tfjs-backend-webgpu's BufferManager has no '${k}': the free-pool cap (src/engine/webgpu_buffer_pool.ts) needs updating for this tfjs version`);
  }
  const stats: FreePoolStats = { trims: 0, bytesDestroyed: 0, capBytes, budgetBytes, created: 0, bytesCreated: 0 };
  const parkedAt = new WeakMap<object, number>(), serial = new WeakMap<object, number>();
  let releases = 0, serials = 0;
  const ordered = process.env.VERL_WEBGPU_POOL_ORDER !== "0";
  const serialOf = (b: object) => {
    let i = serial.get(b);
    if (i === undefined) serial.set(b, (i = serials++));
    return i;
  };
  const acquire = manager.acquireBuffer.bind(manager), release = manager.releaseBuffer.bind(manager);
  manager.releaseBuffer = (buffer, reuse = true) => {
    parkedAt.set(buffer, releases++);
    release(buffer, reuse);
    // tfjs hands out the last buffer parked (pop): keep each free list ordered by the buffers'
    // creation, newest first, so the oldest parked buffer of a size is handed out. Which buffer a
    // tensor gets then depends on which are free, not on the order they came back: a loop binds the
    // same buffers to the same dispatches step after step, and its bind groups are found again
    // (bind_group_cache.ts; with tfjs's order most of a training step's groups were new each step)
    // (VERL_WEBGPU_POOL_ORDER=0 keeps tfjs's order, for comparisons)
    const list = reuse && ordered ? manager.freeBuffers.get(`${buffer.size}_${buffer.usage}`) : undefined;
    if (list && list[list.length - 1] === buffer) orderLast(list, serialOf);
  };
  manager.acquireBuffer = (want, usage, mappedAtCreation = false, reuse = true) => {
    const size = sizeClasses && roundable(usage) ? sizeClass(want) : want;
    const free = manager.numBytesAllocated - manager.numBytesUsed;
    const fresh = !(reuse && (manager.freeBuffers.get(`${size}_${usage}`)?.length ?? 0) > 0);
    if (fresh) {
      stats.created++;
      stats.bytesCreated += size;
    }
    if (fresh && free > capBytes) {
      stats.bytesDestroyed += trimFreeBuffers(manager, Math.floor(capBytes / 2), parkedAt);
      stats.trims++;
    } else if (fresh && free > 0 && manager.numBytesAllocated + size > budgetBytes) {
      stats.bytesDestroyed += trimFreeBuffers(manager, Math.max(0, free - (manager.numBytesAllocated + size - budgetBytes)), parkedAt);
      stats.trims++;
    }
    const buffer = acquire(size, usage, mappedAtCreation, reuse);
    serialOf(buffer as object); // numbered when first handed out: creation order
    if (size !== want) acquiredBytes.set(buffer as object, want);
    else acquiredBytes.delete(buffer as object);
    return buffer;
  };
  installed.set(manager, stats);
  return stats;
}

/** Moves a free list's last buffer to its place in an order of falling serials (the rest is in that order). */
export function orderLast<T extends object>(list: T[], serialOf: (b: T) => number): void {
  const b = list.pop()!, s = serialOf(b);
  let lo = 0, hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (serialOf(list[mid]!) > s) lo = mid + 1; else hi = mid;
  }
  list.splice(lo, 0, b);
}

/** The statistics of a manager the cap is installed on (undefined otherwise). */
export function freePoolStats(manager: object): FreePoolStats | undefined {
  return installed.get(manager);
}

interface BackendLike {
  getBufferData(buffer: GpuBufferLike): Promise<ArrayBuffer | null>;
  copyBuffer(src: GpuBufferLike): GpuBufferLike;
  readToGPU(dataId: object): { buffer: GpuBufferLike };
  tensorMap: { get(dataId: object): { resource?: unknown } | undefined };
}

/**
 * Cuts what a buffer's tensor holds to its first `bytes` (a tensor viewing a prefix of its buffer:
 * rowPrefix in webgpu_kernels.ts); read-backs and copies then see only those bytes.
 */
export function holdPrefix(buffer: GpuBufferLike, bytes: number): void {
  if (bytes > buffer.size) throw new Error(`holdPrefix: ${bytes} bytes do not fit a buffer of ${buffer.size}`);
  if (bytes === buffer.size) acquiredBytes.delete(buffer as object);
  else acquiredBytes.set(buffer as object, bytes);
}

/** The bytes a buffer's tensor holds: what it was acquired for, or its whole size. */
export function tensorBytes(buffer: GpuBufferLike): number {
  return acquiredBytes.get(buffer) ?? buffer.size;
}

/**
 * Makes the backend's read-backs and buffer copies see a rounded buffer's real bytes (the audit at
 * the top): getBufferData returns only those bytes; copyBuffer and readToGPU carry them to the copy.
 */
export function exactReadBack(backend: BackendLike): void {
  for (const k of ["getBufferData", "copyBuffer", "readToGPU", "tensorMap"] as const) {
    if (!(k in backend)) throw new Error(`tfjs-backend-webgpu's backend has no '${k}': the size classes (src/engine/webgpu_buffer_pool.ts) need updating for this tfjs version`);
  }
  const getData = backend.getBufferData.bind(backend), copy = backend.copyBuffer.bind(backend), toGPU = backend.readToGPU.bind(backend);
  backend.getBufferData = async (buffer) => {
    const data = await getData(buffer);
    const n = acquiredBytes.get(buffer);
    return data !== null && n !== undefined && n < data.byteLength ? data.slice(0, n) : data;
  };
  backend.copyBuffer = (src) => {
    const dst = copy(src);
    if (acquiredBytes.has(src)) acquiredBytes.set(dst, acquiredBytes.get(src)!);
    return dst;
  };
  backend.readToGPU = (dataId) => {
    const src = backend.tensorMap.get(dataId)?.resource as GpuBufferLike | undefined;
    const out = toGPU(dataId);
    if (src && acquiredBytes.has(src)) acquiredBytes.set(out.buffer, acquiredBytes.get(src)!);
    return out;
  };
}
