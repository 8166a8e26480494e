// Bind groups kept by what they bind. tfjs makes a new bind group for every dispatch it records, and
// asks the pipeline for its bind-group layout each time. On an H100 those two Dawn calls took 23% of
// a LoRA GRPO step's host time (createBindGroup 20.4%, getBindGroupLayout 2.6%; VERL_PROFILE_GPU_CALLS=1,
// docs/gpu.md), while a training or decode loop binds the same pooled buffers to the same pipelines
// step after step. A bind group is immutable: one made before serves again as long as its buffers
// live. A destroyed buffer takes its bind groups out of the cache; at most `limit` are kept (the
// oldest go first). VERL_WEBGPU_BIND_GROUP_CACHE=0 turns it off.

/** What createBindGroup is given: a layout and buffer entries (other resources are not cached). */
export interface BindGroupDescriptorLike {
  layout: object;
  entries: { binding: number; resource: { buffer?: object; offset?: number; size?: number } | object }[];
}

export interface BindGroupCacheStats { hits: number; misses: number; uncached: number; dropped: number }

export class BindGroupCache {
  readonly stats: BindGroupCacheStats = { hits: 0, misses: 0, uncached: 0, dropped: 0 };
  private readonly groups = new Map<string, unknown>();
  /** cache keys by buffer id, to drop a destroyed buffer's groups */
  private readonly byBuffer = new Map<number, string[]>();
  private readonly ids = new WeakMap<object, number>();
  private nextId = 1;

  constructor(private readonly create: (d: BindGroupDescriptorLike) => unknown, private readonly limit = 50_000) {}

  /** Bind groups held. */
  get size(): number { return this.groups.size; }

  private id(o: object): number {
    let i = this.ids.get(o);
    if (i === undefined) this.ids.set(o, (i = this.nextId++));
    return i;
  }

  get(d: BindGroupDescriptorLike): unknown {
    let key = `${this.id(d.layout)}`;
    const buffers: number[] = [];
    for (const e of d.entries) {
      const r = e.resource as { buffer?: object; offset?: number; size?: number };
      if (!r.buffer) { this.stats.uncached++; return this.create(d); } // a texture or an external resource
      const b = this.id(r.buffer);
      buffers.push(b);
      key += `|${e.binding}:${b}:${r.offset ?? 0}:${r.size ?? ""}`;
    }
    const hit = this.groups.get(key);
    if (hit !== undefined) { this.stats.hits++; return hit; }
    this.stats.misses++;
    const g = this.create(d);
    this.groups.set(key, g);
    for (const b of buffers) {
      const keys = this.byBuffer.get(b);
      if (keys) keys.push(key); else this.byBuffer.set(b, [key]);
    }
    if (this.groups.size > this.limit) this.dropOldest();
    return g;
  }

  /** A buffer is being destroyed: its bind groups go (they would bind a dead buffer). */
  forget(buffer: object): void {
    const b = this.ids.get(buffer);
    if (b === undefined) return;
    const keys = this.byBuffer.get(b);
    if (!keys) return;
    this.byBuffer.delete(b);
    for (const k of keys) if (this.groups.delete(k)) this.stats.dropped++;
  }

  private dropOldest(): void {
    // a tenth at a time: Map iterates in insertion order (keys of other buffers' lists go stale and are skipped)
    let n = Math.ceil(this.limit / 10);
    for (const k of this.groups.keys()) {
      if (n-- <= 0) break;
      this.groups.delete(k);
      this.stats.dropped++;
    }
    // index lists keep stale keys until their buffer goes; prune them when they outgrow the cache
    if (this.byBuffer.size > 2 * this.limit) {
      for (const [b, keys] of this.byBuffer) {
        const live = keys.filter((k) => this.groups.has(k));
        if (live.length) this.byBuffer.set(b, live); else this.byBuffer.delete(b);
      }
    }
  }
}

interface PipelineLike { getBindGroupLayout(index: number): object }
interface DeviceLike {
  createBindGroup(d: BindGroupDescriptorLike): unknown;
  createComputePipeline?(d: unknown): PipelineLike;
  createComputePipelineAsync?(d: unknown): Promise<PipelineLike>;
}

const caches = new Set<BindGroupCache>();

/** This thread's bind-group counts (summed over its devices' caches), undefined without a cache. */
export function bindGroupStats(): BindGroupCacheStats | undefined {
  if (caches.size === 0) return undefined;
  const t: BindGroupCacheStats = { hits: 0, misses: 0, uncached: 0, dropped: 0 };
  for (const c of caches) for (const k of Object.keys(t) as (keyof BindGroupCacheStats)[]) t[k] += c.stats[k];
  return t;
}

let destroyHooked = false;

/**
 * Gives `device` a bind-group cache and pipelines that answer getBindGroupLayout(i) with one object
 * per index (the cache's key needs the same layout object each time; the layouts never change).
 * `bufferClass` (the webgpu package's GPUBuffer) has destroy() wrapped once to drop a dying buffer's
 * groups. Returns the cache (bindGroupStats reads it), or undefined when turned off.
 */
export function cacheBindGroups(device: DeviceLike, bufferClass: { prototype: { destroy(): void } } | undefined): BindGroupCache | undefined {
  if (process.env.VERL_WEBGPU_BIND_GROUP_CACHE === "0" || !bufferClass) return undefined;
  const memo = (p: PipelineLike): PipelineLike => {
    const get = p.getBindGroupLayout.bind(p), layouts = new Map<number, object>();
    p.getBindGroupLayout = (i: number) => {
      let l = layouts.get(i);
      if (l === undefined) layouts.set(i, (l = get(i)));
      return l;
    };
    return p;
  };
  const sync = device.createComputePipeline?.bind(device), async = device.createComputePipelineAsync?.bind(device);
  if (sync) device.createComputePipeline = (d: unknown) => memo(sync(d));
  if (async) device.createComputePipelineAsync = async (d: unknown) => memo(await async(d));
  const cache = new BindGroupCache(device.createBindGroup.bind(device));
  device.createBindGroup = (d: BindGroupDescriptorLike) => cache.get(d);
  caches.add(cache);
  if (!destroyHooked) {
    const destroy = bufferClass.prototype.destroy;
    bufferClass.prototype.destroy = function (this: object) {
      for (const c of caches) c.forget(this);
      return destroy.call(this);
    };
    destroyHooked = true;
  }
  return cache;
}
