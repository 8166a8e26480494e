// How many CPU threads the llama_cpp engine gives llama.cpp. Left to itself
// llama.cpp counts the host's cores, not the ones this process may use (a
// container's cgroup quota) nor the other ranks on the host running their own
// llama.cpp at the same time: on a 2-core VM with 2 ranks its busy-waiting threads
// oversubscribed the cores and a smoke rollout spun for 77 s. The usable cores are
// the smaller of os.availableParallelism() (CPU affinity) and the cgroup quota,
// shared evenly among the host's ranks (LOCAL_WORLD_SIZE), at least one each.
import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";

type ReadFile = (path: string) => string;

const readText: ReadFile = (p) => readFileSync(p, "utf8");

/** Cores allowed by the cgroup CPU quota (v2 cpu.max, else v1 cfs quota), rounded up; undefined when unlimited or unknown. */
export function cgroupCpuLimit(read: ReadFile = readText): number | undefined {
  const ratio = (quota: number, period: number) => (quota > 0 && period > 0 ? Math.max(1, Math.ceil(quota / period)) : undefined);
  try {
    const [q, p] = read("/sys/fs/cgroup/cpu.max").trim().split(/\s+/);
    if (q === "max") return undefined;
    return ratio(Number(q), Number(p));
  } catch {
    // not cgroup v2: try v1
  }
  try {
    return ratio(Number(read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").trim()), Number(read("/sys/fs/cgroup/cpu/cpu.cfs_period_us").trim()));
  } catch {
    return undefined;
  }
}

export interface ThreadInputs {
  /** engine_kwargs.llama_cpp.threads (0: choose). */
  configured: number;
  availableParallelism: number;
  cgroupCpus?: number | undefined;
  /** Ranks on this host, each running its own llama.cpp. */
  ranksOnHost: number;
}

/** The thread count and a sentence saying where it came from (logged once per engine). */
export function pickLlamaThreads(i: ThreadInputs): { threads: number; why: string } {
  if (i.configured > 0) return { threads: i.configured, why: `engine_kwargs.llama_cpp.threads=${i.configured}` };
  const fromCgroup = i.cgroupCpus !== undefined && i.cgroupCpus < i.availableParallelism;
  const cores = Math.max(1, fromCgroup ? i.cgroupCpus! : i.availableParallelism);
  const ranks = Math.max(1, i.ranksOnHost);
  return {
    threads: Math.max(1, Math.floor(cores / ranks)),
    why: `${cores} usable cores (${fromCgroup ? "cgroup cpu quota" : "os.availableParallelism"}) / ${ranks} rank${ranks === 1 ? "" : "s"} on this host`,
  };
}

/** The engine's choice in this process: LOCAL_WORLD_SIZE ranks share the cores. */
export function llamaThreadsHere(configured: number, env: NodeJS.ProcessEnv = process.env): { threads: number; why: string } {
  const ranks = Number(env.LOCAL_WORLD_SIZE ?? env.WORLD_SIZE ?? 1);
  return pickLlamaThreads({ configured, availableParallelism: availableParallelism(), cgroupCpus: cgroupCpuLimit(), ranksOnHost: Number.isInteger(ranks) && ranks > 0 ? ranks : 1 });
}
