// Issue 28 item 11: the llama_cpp engine's CPU threads come from the cores this
// process may really use (cgroup quota, os.availableParallelism) shared among the
// ranks on the host. Pure functions: runs without node-llama-cpp.
import { test } from "node:test";
import assert from "node:assert/strict";
import { cgroupCpuLimit, pickLlamaThreads } from "../../src/rollout/llama_cpp/threads.js";

const files = (m: Record<string, string>) => (p: string) => {
  if (!(p in m)) throw Object.assign(new Error(`ENOENT: ${p}`), { code: "ENOENT" });
  return m[p]!;
};

test("cgroup v2 cpu.max: a quota gives cores (rounded up), 'max' gives none", () => {
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu.max": "150000 100000\n" })), 2);
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu.max": "100000 100000\n" })), 1);
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu.max": "50000 100000\n" })), 1);
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu.max": "max 100000\n" })), undefined);
});

test("cgroup v1 cfs quota, and no cgroup files at all", () => {
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "400000\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n" })), 4);
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n" })), undefined);
  assert.equal(cgroupCpuLimit(files({})), undefined);
  assert.equal(cgroupCpuLimit(files({ "/sys/fs/cgroup/cpu.max": "garbage" })), undefined);
});

test("threads: the usable cores divided among the host's ranks, at least one", () => {
  // the machine: 2 cores, 2 ranks -> 1 thread each (llama.cpp's own choice oversubscribed them)
  assert.deepEqual(pickLlamaThreads({ configured: 0, availableParallelism: 2, ranksOnHost: 2 }).threads, 1);
  assert.equal(pickLlamaThreads({ configured: 0, availableParallelism: 64, cgroupCpus: 8, ranksOnHost: 2 }).threads, 4);
  assert.equal(pickLlamaThreads({ configured: 0, availableParallelism: 4, cgroupCpus: 16, ranksOnHost: 1 }).threads, 4);
  assert.equal(pickLlamaThreads({ configured: 0, availableParallelism: 2, ranksOnHost: 8 }).threads, 1);
  const p = pickLlamaThreads({ configured: 0, availableParallelism: 64, cgroupCpus: 8, ranksOnHost: 2 });
  assert.match(p.why, /8 usable cores \(cgroup cpu quota\) \/ 2 ranks on this host/);
});

test("a configured thread count wins", () => {
  const p = pickLlamaThreads({ configured: 3, availableParallelism: 2, ranksOnHost: 2 });
  assert.equal(p.threads, 3);
  assert.match(p.why, /engine_kwargs\.llama_cpp\.threads=3/);
});
