// Progress counters in shared memory, one int32 per rank. A rank thread bumps its
// own counter while it works (its event loop, every wait slice of a collective, and
// heartbeat() calls in long synchronous loops: per token, per micro-batch, per saved
// tensor); the driver's watchdog fails a rank whose counter stands still during a
// call for longer than the heartbeat timeout. A busy loop cannot answer a message,
// but it also stops the counter, which the driver can read without its help.

let counters: Int32Array | undefined;
let slot = 0;

/** Shared counters for a pool of `worldSize` ranks. */
export function createHeartbeatBuffer(worldSize: number): SharedArrayBuffer {
  return new SharedArrayBuffer(4 * worldSize);
}

/** Called once per rank thread by the pool runtime. */
export function attachHeartbeat(buffer: SharedArrayBuffer, rank: number): void {
  counters = new Int32Array(buffer);
  slot = rank;
}

/** "Still working": cheap (one atomic add); a no-op outside a pool thread. */
export function heartbeat(): void {
  if (counters) Atomics.add(counters, slot, 1);
}
