// Uniform buffers kept by their contents. tfjs writes every dispatch's uniforms (shapes, strides,
// the program's own values) into a buffer taken from its pool and hands that buffer back after the
// next submit, so the same dispatch binds a different uniform buffer from one step to the next. The
// bind-group cache (bind_group_cache.ts) keys on the buffers a group binds, and so missed on almost
// every dispatch of a training pass: on the H100, a third of the LoRA update's bind groups came
// from it. A loop's dispatches repeat their uniforms exactly (same shapes, same constants), so here
// a block seen twice gets a buffer of its own, written once and never again: the next dispatch with
// those bytes binds that buffer (no writeBuffer, no pool traffic), and with its other buffers
// unchanged its bind group is the one made before. Blocks met once (a seed, an optimizer step's
// counter) take tfjs's pooled path as before. At most `limit` buffers are kept; the least recently
// used go, destroyed after the next submit (the commands recorded with them may not have been
// submitted yet). VERL_WEBGPU_UNIFORM_CACHE=0 turns it off.
import { packUniforms, type SteppedUniform } from "./webgpu_replay.js";

interface UniformBufferLike { destroy(): void }
interface DeviceLike {
  createBuffer(d: { size: number; usage: number }): UniformBufferLike;
  queue: { writeBuffer(b: unknown, off: number, data: ArrayBuffer, dOff?: number, size?: number): void };
}
/** The tfjs WebGPU backend's members this module wraps. */
export interface UniformBackend {
  device: DeviceLike;
  makeUniforms(values: SteppedUniform[]): { offset: number; size: number; buffer: unknown };
  submitQueue(): void;
}

export interface UniformCacheStats { hits: number; stored: number; pooled: number; evicted: number }

/** GPUBufferUsage.UNIFORM | COPY_DST (the constants are not globals in every Node setup). */
const UNIFORM_USAGE = 0x0040 | 0x0008;

export class UniformCache {
  readonly stats: UniformCacheStats = { hits: 0, stored: 0, pooled: 0, evicted: 0 };
  /** kept blocks by their bytes, least recently used first (Map order, refreshed on a hit) */
  private readonly kept = new Map<string, { buffer: UniformBufferLike; size: number }>();
  /** blocks seen once, not yet kept (bounded like `kept`) */
  private readonly seen = new Set<string>();
  /** evicted buffers, destroyed after the next submit */
  private retired: UniformBufferLike[] = [];

  constructor(private readonly device: DeviceLike, private readonly pooled: (values: SteppedUniform[]) => { offset: number; size: number; buffer: unknown },
    readonly limit = 8192) {}

  /** Buffers kept. */
  get size(): number { return this.kept.size; }

  make(values: SteppedUniform[]): { offset: number; size: number; buffer: unknown } {
    const { bytes } = packUniforms(values);
    const key = new Int32Array(bytes).join(",");
    const hit = this.kept.get(key);
    if (hit) {
      this.stats.hits++;
      this.kept.delete(key);
      this.kept.set(key, hit);
      return { offset: 0, size: hit.size, buffer: hit.buffer };
    }
    if (!this.seen.has(key)) {
      this.seen.add(key);
      if (this.seen.size > this.limit) this.seen.delete(this.seen.values().next().value!);
      this.stats.pooled++;
      return this.pooled(values);
    }
    this.seen.delete(key);
    const size = bytes.byteLength, buffer = this.device.createBuffer({ size, usage: UNIFORM_USAGE });
    this.device.queue.writeBuffer(buffer, 0, bytes, 0, size);
    this.kept.set(key, { buffer, size });
    this.stats.stored++;
    if (this.kept.size > this.limit) {
      const [oldest, entry] = this.kept.entries().next().value!;
      this.kept.delete(oldest);
      this.retired.push(entry.buffer);
      this.stats.evicted++;
    }
    return { offset: 0, size, buffer };
  }

  /** After a submit: the evicted buffers' commands are on the queue, so they can go. */
  afterSubmit(): void {
    if (!this.retired.length) return;
    for (const b of this.retired) b.destroy();
    this.retired = [];
  }
}

const caches = new Set<UniformCache>();

/** This thread's uniform-cache counts, undefined without a cache. */
export function uniformCacheStats(): UniformCacheStats | undefined {
  if (caches.size === 0) return undefined;
  const t: UniformCacheStats = { hits: 0, stored: 0, pooled: 0, evicted: 0 };
  for (const c of caches) for (const k of Object.keys(t) as (keyof UniformCacheStats)[]) t[k] += c.stats[k];
  return t;
}

/** Gives the backend content-keyed uniform buffers (see above); returns the cache, or undefined when turned off. */
export function cacheUniforms(backend: UniformBackend, limit?: number): UniformCache | undefined {
  if (process.env.VERL_WEBGPU_UNIFORM_CACHE === "0") return undefined;
  for (const k of ["makeUniforms", "submitQueue", "device"] as const) {
    if (!(k in backend)) throw new Error(`tfjs-backend-webgpu's backend has no '${k}': the uniform cache (src/engine/uniform_cache.ts) needs updating for this tfjs version`);
  }
  const pooled = backend.makeUniforms.bind(backend), submit = backend.submitQueue.bind(backend);
  const cache = new UniformCache(backend.device, pooled, limit);
  backend.makeUniforms = (values) => cache.make(values);
  backend.submitQueue = () => { submit(); cache.afterSubmit(); };
  caches.add(cache);
  return cache;
}
