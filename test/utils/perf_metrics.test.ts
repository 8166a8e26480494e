// The perf/ memory metrics: the peak of tfjs's tensor bytes, the backend's reserved memory, and
// psutil's "used" from /proc/meminfo.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { getDeviceFlops } from "../../src/utils/flops_counter.js";
import { memoryMetrics, systemMemoryUsedBytes, trackPeakTensorBytes, trainingDeviceName, webGpuDeviceName } from "../../src/utils/perf_metrics.js";

const GIB = 1024 ** 3;

test("perf/cpu_memory_used_gb is psutil's used: MemTotal - MemFree - Buffers - Cached - SReclaimable", () => {
  const meminfo = "MemTotal:       16000000 kB\nMemFree:         2000000 kB\nMemAvailable:    9000000 kB\nBuffers:          500000 kB\nCached:          6000000 kB\nSReclaimable:     400000 kB\n";
  assert.equal(systemMemoryUsedBytes(meminfo), (16000000 - 2000000 - 500000 - 6000000 - 400000) * 1024);
  // negative (a container's distorted figures): total - free, as psutil
  assert.equal(systemMemoryUsedBytes("MemTotal: 100 kB\nMemFree: 40 kB\nCached: 90 kB\n"), 60 * 1024);
  const live = systemMemoryUsedBytes();
  assert.ok(live > 0 && Number.isFinite(live), `live ${live}`);
});

test("perf/max_memory_allocated_gb keeps the peak of the tensors' bytes after they are freed", async () => {
  await initBackend("cpu");
  trackPeakTensorBytes();
  const before = memoryMetrics("cpu")["perf/max_memory_allocated_gb"]! * GIB;
  const big = tf.zeros([4 << 20], "float32"); // 16 MiB above whatever is live now
  const during = tf.memory().numBytes;
  big.dispose();
  const m = memoryMetrics("cpu");
  const peak = m["perf/max_memory_allocated_gb"]! * GIB;
  assert.ok(peak >= during && peak >= before, `peak ${peak}, bytes while the tensor lived ${during}`);
  assert.ok(tf.memory().numBytes < peak, "the tensor is gone but the peak stays");
  // the cpu backend keeps tensors in the process: reserved is the process's peak resident set
  assert.ok(m["perf/max_memory_reserved_gb"]! * GIB >= 16 << 20, `reserved ${m["perf/max_memory_reserved_gb"]}`);
  assert.ok(m["perf/cpu_memory_used_gb"]! > 0);
  assert.equal(trainingDeviceName("cpu"), "CPU");
  assert.equal(trainingDeviceName("wasm"), "CPU");
});

test("the WebGPU device name: Dawn's model name in CUDA's spelling, else the adapter line", () => {
  // what Dawn reports on the H200 machine (docs/gpu.md): device "nvidia-h200", description the driver version
  const h200 = { device: "nvidia-h200", adapter: "nvidia nvidia-h200 NVIDIA: 580.159.04 580.159.4.0" };
  assert.equal(webGpuDeviceName(h200), "NVIDIA H200");
  assert.equal(getDeviceFlops(webGpuDeviceName(h200)), 989e12);
  // llvmpipe's software adapter names no model: no table entry, MFU 0 as verl for an unknown device
  const soft = { adapter: "mesa llvmpipe (LLVM 15.0.7, 256 bits)" };
  assert.equal(webGpuDeviceName(soft), soft.adapter);
  assert.equal(getDeviceFlops(webGpuDeviceName(soft)), Infinity);
});
