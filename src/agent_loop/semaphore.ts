// Bounds how many agent loops run at once (rollout.agent.max_concurrent_loops).

export class Semaphore {
  private readonly waiters: (() => void)[] = [];
  private available: number;

  constructor(readonly capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new Error(`semaphore capacity must be a positive integer, got ${capacity}`);
    this.available = capacity;
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.available > 0) this.available--;
    else await new Promise<void>((resolve) => this.waiters.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.waiters.shift();
      if (next) next();
      else this.available++;
    }
  }
}
