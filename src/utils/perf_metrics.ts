// What a rank can measure of its device for verl's perf/ metrics: the device's name (for the
// promised FLOPs of flops_counter.ts) and memory. verl reads torch's CUDA allocator (peak bytes in
// tensors, peak bytes the allocator holds) and psutil; here each number is the nearest thing the
// backend really exposes (docs/training.md lists them), never an estimate.
import { readFileSync } from "node:fs";
import { freemem, totalmem } from "node:os";
import * as tf from "@tensorflow/tfjs";
import { webGpuInfo } from "../engine/webgpu.js";

const GIB = 1024 ** 3;

/**
 * The name verl's device table is searched with (verl: torch's device name, "NVIDIA H200"): on
 * webgpu the GPU model Dawn names in the adapter info, else the whole adapter line; "CPU" on wasm,
 * cpu and tfjs-node's CPU build. tfjs-node-gpu on CUDA does not say which GPU it runs on, so its
 * name matches nothing (promised FLOPs infinite, MFU 0, as verl reports for a GPU it does not know).
 */
export function trainingDeviceName(backend: string): string {
  if (backend === "webgpu") return webGpuDeviceName(webGpuInfo);
  if (backend === "tensorflow") {
    const onGpu = (tf.findBackend("tensorflow") as { isUsingGpuDevice?: boolean } | null)?.isUsingGpuDevice;
    return onGpu === false ? "CPU" : "tfjs-node-gpu (GPU name unknown)";
  }
  return "CPU";
}

/**
 * Dawn spells the model lower-case with hyphens ("nvidia-h200" on the H200, whose adapter
 * description is only the driver version); in CUDA's spelling, upper-cased, it is "NVIDIA H200".
 */
export function webGpuDeviceName(info: { device?: string; adapter?: string }): string {
  if (info.device) return info.device.toUpperCase().replace(/-/g, " ");
  return info.adapter ?? "webgpu (adapter unknown)";
}

interface EngineStateLike { numBytes: number }

let trackedState: EngineStateLike | undefined;
let peakTensorBytes = 0;

/**
 * Follows the largest number of bytes this thread's tfjs engine has held in tensors (torch's
 * max_memory_allocated): tfjs keeps only the current count, so its field becomes an accessor
 * that remembers the maximum on every allocation. Call once the backend is up; calling again
 * re-attaches after a tf.engine().reset(), which replaces the state.
 */
export function trackPeakTensorBytes(): void {
  const state = (tf.engine() as unknown as { state: EngineStateLike }).state;
  if (state === trackedState) return;
  let current = state.numBytes;
  peakTensorBytes = Math.max(peakTensorBytes, current);
  Object.defineProperty(state, "numBytes", {
    configurable: true, enumerable: true,
    get: () => current,
    set: (v: number) => {
      current = v;
      if (v > peakTensorBytes) peakTensorBytes = v;
    },
  });
  trackedState = state;
}

let peakReservedBytes = 0;

/**
 * Bytes the backend holds for tensors, in use or pooled (torch's max_memory_reserved): the WebGPU
 * buffer manager's allocation, or the wasm heap (it only grows). The cpu and tensorflow backends
 * keep tensors in the process's own memory, so there it is the process's peak resident set (one
 * process holds every rank thread).
 */
function reservedBytes(backend: string): number {
  if (backend === "webgpu") return (tf.memory() as { numBytesAllocatedInGPU?: number }).numBytesAllocatedInGPU ?? 0;
  if (backend === "wasm") {
    const heap = (tf.findBackend("wasm") as { wasm?: { HEAPU8?: Uint8Array } } | null)?.wasm?.HEAPU8;
    if (heap) return heap.buffer.byteLength;
  }
  return process.resourceUsage().maxRSS * 1024;
}

/**
 * psutil.virtual_memory().used on Linux: MemTotal - MemFree - Buffers - (Cached + SReclaimable),
 * falling back to total - free where that is negative; elsewhere os.totalmem() - os.freemem().
 */
export function systemMemoryUsedBytes(meminfo?: string): number {
  let text = meminfo;
  if (text === undefined) {
    try {
      text = readFileSync("/proc/meminfo", "utf8");
    } catch {
      return totalmem() - freemem();
    }
  }
  const kb = (key: string): number => {
    const m = new RegExp(`^${key}:\\s+(\\d+)`, "m").exec(text!);
    return m ? Number(m[1]) * 1024 : 0;
  };
  const total = kb("MemTotal"), free = kb("MemFree");
  const used = total - free - kb("Buffers") - kb("Cached") - kb("SReclaimable");
  return used < 0 ? total - free : used;
}

/** perf/max_memory_allocated_gb, perf/max_memory_reserved_gb, perf/cpu_memory_used_gb of this rank, in GiB as verl. */
export function memoryMetrics(backend: string): Record<string, number> {
  trackPeakTensorBytes();
  peakReservedBytes = Math.max(peakReservedBytes, reservedBytes(backend));
  return {
    "perf/max_memory_allocated_gb": peakTensorBytes / GIB,
    "perf/max_memory_reserved_gb": peakReservedBytes / GIB,
    "perf/cpu_memory_used_gb": systemMemoryUsedBytes() / GIB,
  };
}
