// Progress counters in shared memory, one int32 per rank. A rank thread bumps its
// own counter while it works (its event loop, every wait slice of a collective, and
// heartbeat() calls in long synchronous loops: per token, per micro-batch, per saved
// tensor); the driver's watchdog fails a rank whose counter stands still during a
// call for longer than the heartbeat timeout. A busy loop cannot answer a message,
// but it also stops the counter, which the driver can read without its help.
//
// A long native call cannot tick either: Dawn compiling a pipeline (seconds on a software
// Vulkan, lavapipe) blocks the thread inside one C++ call. insideNativeCall() marks such calls in
// a second counter per rank, and the watchdog then allows NATIVE_CALL_GRACE times the timeout:
// a rank stopped there would be terminated mid-call, which aborts the whole process (exit 134)
// instead of failing the pool with the rank's error.
//
// VERL_HEARTBEAT_STATS=1 also records, per rank thread, the longest gap between two
// ticks and the peak V8 heap, logged when the pool shuts down: the figures the
// default trainer.heartbeat_timeout and trainer.rank_heap_limit_mb are set from
// (docs/configuration.md).
import { getHeapStatistics } from "node:v8";

let counters: Int32Array | undefined;
let slot = 0;

/** How many timeouts a rank inside a marked native call gets before the watchdog fails it. */
export const NATIVE_CALL_GRACE = 10;
const stats = { on: false, last: 0, longestGapMs: 0, peakHeapMb: 0 };

/** Shared counters for a pool of `worldSize` ranks: progress at [rank], native-call depth at [worldSize + rank]. */
export function createHeartbeatBuffer(worldSize: number): SharedArrayBuffer {
  return new SharedArrayBuffer(8 * worldSize);
}

/** Where `rank`'s native-call depth sits in the counters (after every rank's progress counter). */
const nativeDepthAt = (view: Int32Array, rank: number) => view.length / 2 + rank;

/** Whether `rank` is inside a native call marked by insideNativeCall (read by the watchdog). */
export function inNativeCall(view: Int32Array, rank: number): boolean {
  return Atomics.load(view, nativeDepthAt(view, rank)) > 0;
}

/** Called once per rank thread by the pool runtime. */
export function attachHeartbeat(buffer: SharedArrayBuffer, rank: number, env: NodeJS.ProcessEnv = process.env): void {
  counters = new Int32Array(buffer);
  slot = rank;
  stats.on = env.VERL_HEARTBEAT_STATS === "1";
  stats.last = performance.now();
}

/** "Still working": cheap (one atomic add); a no-op outside a pool thread. */
export function heartbeat(): void {
  if (!counters) return;
  Atomics.add(counters, slot, 1);
  if (stats.on) {
    const now = performance.now();
    if (now - stats.last > stats.longestGapMs) stats.longestGapMs = now - stats.last;
    stats.last = now;
  }
}

/** Runs `fn`, a synchronous call into native code that may take long (a pipeline compile), marked for the watchdog. */
export function insideNativeCall<T>(fn: () => T): T {
  if (!counters) return fn();
  const depth = nativeDepthAt(counters, slot);
  heartbeat();
  Atomics.add(counters, depth, 1);
  try {
    return fn();
  } finally {
    Atomics.sub(counters, depth, 1);
    heartbeat();
  }
}

/** Samples the heap (with VERL_HEARTBEAT_STATS=1; called by the rank's event-loop tick). */
export function sampleHeap(): void {
  if (!stats.on) return;
  const mb = getHeapStatistics().used_heap_size / 2 ** 20;
  if (mb > stats.peakHeapMb) stats.peakHeapMb = mb;
}

/** This thread's longest gap between ticks and peak heap so far, or null when stats are off. */
export function heartbeatStats(): { longestGapMs: number; peakHeapMb: number } | null {
  return stats.on ? { longestGapMs: Math.round(stats.longestGapMs), peakHeapMb: Math.round(stats.peakHeapMb) } : null;
}
