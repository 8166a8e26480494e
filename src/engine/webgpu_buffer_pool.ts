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

import { spawnSync } from "node:child_process";

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
 * Where the GPU's memory is known, the default cap is this share of it. A training step frees and
 * asks again for far more than a few GB between its micro-batches and around the optimizer: on
 * the H200 (141 GB) the 0.5B-shaped GRPO update destroyed and re-created 85 GB of buffers a step
 * at a 4 GiB cap (update 9-10.5 s), ~18 GB at 32 GiB, none at 64 GiB (6.1-8 s; VERL_PROFILE_UPDATE=1,
 * 2026-12-04). Half leaves the other half for live tensors.
 */
export const FREE_POOL_SHARE_OF_GPU = 0.5;

export interface FreePoolStats {
  trims: number; bytesDestroyed: number; capBytes: number;
  /** buffers created (no free one of the size was parked) and their bytes: the churn a too-small cap causes */
  created: number; bytesCreated: number;
}

const installed = new WeakMap<object, FreePoolStats>();

/**
 * The cap in bytes: VERL_WEBGPU_FREE_POOL_MB (a number of MiB >= 0) when set, else
 * FREE_POOL_SHARE_OF_GPU of `gpuBytes` when known, else DEFAULT_FREE_POOL_MB.
 */
export function freePoolCapBytes(env: string | undefined = process.env.VERL_WEBGPU_FREE_POOL_MB, gpuBytes?: number): number {
  if (env === undefined || env === "") {
    return gpuBytes !== undefined && gpuBytes > 0 ? Math.floor(gpuBytes * FREE_POOL_SHARE_OF_GPU) : DEFAULT_FREE_POOL_MB * 2 ** 20;
  }
  const mb = Number(env);
  if (!Number.isFinite(mb) || mb < 0) throw new Error(`VERL_WEBGPU_FREE_POOL_MB must be a number of MiB >= 0, got '${env}'`);
  return Math.floor(mb * 2 ** 20);
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
 * Wraps the manager's acquireBuffer and releaseBuffer so the free lists never hold more than
 * `capBytes` when a new buffer is created (trimmed to half the cap, oldest first). Idempotent per
 * manager; returns the live statistics.
 */
export function capFreeBufferPool(manager: BufferManagerLike, capBytes = freePoolCapBytes()): FreePoolStats {
  const have = installed.get(manager);
  if (have) return have;
  for (const k of ["freeBuffers", "numBytesAllocated", "numBytesUsed", "acquireBuffer", "releaseBuffer"] as const) {
    if (!(k in manager)) throw new Error(`tfjs-backend-webgpu's BufferManager has no '${k}': the free-pool cap (src/engine/webgpu_buffer_pool.ts) needs updating for this tfjs version`);
  }
  const stats: FreePoolStats = { trims: 0, bytesDestroyed: 0, capBytes, created: 0, bytesCreated: 0 };
  const parkedAt = new WeakMap<object, number>();
  let releases = 0;
  const acquire = manager.acquireBuffer.bind(manager), release = manager.releaseBuffer.bind(manager);
  manager.releaseBuffer = (buffer, reuse = true) => {
    parkedAt.set(buffer, releases++);
    release(buffer, reuse);
  };
  manager.acquireBuffer = (size, usage, mappedAtCreation = false, reuse = true) => {
    const free = manager.numBytesAllocated - manager.numBytesUsed;
    const fresh = !(reuse && (manager.freeBuffers.get(`${size}_${usage}`)?.length ?? 0) > 0);
    if (fresh) {
      stats.created++;
      stats.bytesCreated += size;
    }
    if (free > capBytes && fresh) {
      stats.bytesDestroyed += trimFreeBuffers(manager, Math.floor(capBytes / 2), parkedAt);
      stats.trims++;
    }
    return acquire(size, usage, mappedAtCreation, reuse);
  };
  installed.set(manager, stats);
  return stats;
}

/** The statistics of a manager the cap is installed on (undefined otherwise). */
export function freePoolStats(manager: object): FreePoolStats | undefined {
  return installed.get(manager);
}
