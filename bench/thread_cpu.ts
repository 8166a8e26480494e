// CPU time of one thread from /proc (Linux; Node 20 has no per-thread CPU clock):
// on a shared machine wall time depends on the load, CPU time per thread says
// which side does the work. Milliseconds (user + system), 10 ms ticks.
import { readFileSync } from "node:fs";

const TICK_MS = 10; // CLK_TCK is 100 on Linux

/** CPU ms so far of the calling thread, or of the main thread of process `pid`; NaN where /proc is absent. */
export function threadCpuMs(pid: number | "self" = "self"): number {
  const path = pid === "self" ? "/proc/thread-self/stat" : `/proc/${pid}/task/${pid}/stat`;
  try {
    const stat = readFileSync(path, "utf8");
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) * TICK_MS;
  } catch {
    return NaN;
  }
}
