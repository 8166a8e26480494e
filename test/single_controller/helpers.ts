// Shared test helpers: fixture URLs and a pool that is always destroyed, with a
// hard time limit so a hang fails the test instead of blocking the run.
import { ResourcePool, type ResourcePoolOptions } from "../../src/single_controller/index.js";

export const fixture = (name: string): URL => new URL(`./fixtures/${name}.js`, import.meta.url);

export async function withPool<T>(opts: ResourcePoolOptions | number, body: (pool: ResourcePool) => Promise<T>, limitMs = 15_000): Promise<T> {
  const pool = new ResourcePool(opts);
  let timer: NodeJS.Timeout | undefined;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`hard time limit of ${limitMs} ms exceeded (a call hung)`)), limitMs);
  });
  try {
    return await Promise.race([body(pool), limit]);
  } finally {
    clearTimeout(timer);
    await pool.destroy();
  }
}

export async function waitFor(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
