// The bind-group cache (engine/bind_group_cache.ts) on stand-in Dawn objects: a bind group made once
// per distinct (layout, buffers, offsets, sizes), never across different ones; a destroyed buffer's
// groups dropped; the size bounded; non-buffer resources passed through; and the device wiring (one
// layout object per pipeline and index, destroy() hooked). The WebGPU suites (llvmpipe, the H100)
// run every kernel through it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BindGroupCache, cacheBindGroups, type BindGroupDescriptorLike } from "../../src/engine/bind_group_cache.js";

class FakeBuffer { destroyed = false; destroy(): void { this.destroyed = true; } }

function counting() {
  const made: BindGroupDescriptorLike[] = [];
  return { made, create: (d: BindGroupDescriptorLike) => { made.push(d); return { group: made.length }; } };
}
const desc = (layout: object, ...bufs: [FakeBuffer, number?, number?][]): BindGroupDescriptorLike =>
  ({ layout, entries: bufs.map(([buffer, offset, size], binding) => ({ binding, resource: { buffer, offset, size } })) });

test("a bind group is made once per distinct layout, buffers, offsets and sizes", () => {
  const { made, create } = counting(), cache = new BindGroupCache(create);
  const L1 = {}, L2 = {}, a = new FakeBuffer(), b = new FakeBuffer(), u = new FakeBuffer();
  const g1 = cache.get(desc(L1, [a], [b], [u, 0, 32]));
  assert.equal(cache.get(desc(L1, [a], [b], [u, 0, 32])), g1, "the same bindings: the same group");
  assert.notEqual(cache.get(desc(L1, [b], [a], [u, 0, 32])), g1, "buffers swapped");
  assert.notEqual(cache.get(desc(L2, [a], [b], [u, 0, 32])), g1, "another layout");
  assert.notEqual(cache.get(desc(L1, [a], [b], [u, 0, 48])), g1, "another uniform size");
  assert.notEqual(cache.get(desc(L1, [a], [b], [u, 16, 32])), g1, "another offset");
  assert.equal(made.length, 5);
  assert.deepEqual({ hits: cache.stats.hits, misses: cache.stats.misses }, { hits: 1, misses: 5 });
});

test("a destroyed buffer's bind groups are dropped; others stay", () => {
  const { made, create } = counting(), cache = new BindGroupCache(create);
  const L = {}, a = new FakeBuffer(), b = new FakeBuffer(), c = new FakeBuffer();
  const ab = cache.get(desc(L, [a], [b])), cb = cache.get(desc(L, [c], [b]));
  cache.forget(a);
  assert.notEqual(cache.get(desc(L, [a], [b])), ab, "made again after a's destroy");
  assert.equal(cache.get(desc(L, [c], [b])), cb, "c and b's group stays");
  cache.forget(b);
  assert.equal(cache.size, 0);
  assert.equal(made.length, 3);
  cache.forget(new FakeBuffer()); // never bound: nothing to do
});

test("the cache is bounded (oldest dropped) and non-buffer resources pass through uncached", () => {
  const { made, create } = counting(), cache = new BindGroupCache(create, 20);
  const L = {}, bufs = Array.from({ length: 50 }, () => new FakeBuffer());
  for (const b of bufs) cache.get(desc(L, [b]));
  assert.ok(cache.size <= 20, `size ${cache.size}`);
  const last = cache.get(desc(L, [bufs[49]!]));
  assert.equal(made.length, 50, "the newest stays");
  assert.ok(last);
  cache.get(desc(L, [bufs[0]!]));
  assert.equal(made.length, 51, "the oldest was dropped");
  const view = { texture: true };
  cache.get({ layout: L, entries: [{ binding: 0, resource: view }] });
  cache.get({ layout: L, entries: [{ binding: 0, resource: view }] });
  assert.equal(cache.stats.uncached, 2);
  assert.equal(made.length, 53);
});

test("cacheBindGroups: one layout object per pipeline and index, groups cached, destroy() drops them, off by env", () => {
  let layoutsMade = 0, groupsMade = 0;
  class Buffer { destroy(): void {} }
  const device = {
    createComputePipeline: () => ({ getBindGroupLayout: (i: number) => ({ i, n: ++layoutsMade }) }),
    createBindGroup: (d: BindGroupDescriptorLike) => ({ d, n: ++groupsMade }),
  };
  const cache = cacheBindGroups(device, Buffer);
  assert.ok(cache);
  const p = device.createComputePipeline();
  const l0 = p.getBindGroupLayout(0);
  assert.equal(p.getBindGroupLayout(0), l0);
  assert.equal(layoutsMade, 1);
  const buf = new Buffer();
  const d = { layout: l0, entries: [{ binding: 0, resource: { buffer: buf } }] };
  const g = device.createBindGroup(d);
  assert.equal(device.createBindGroup(d), g);
  assert.equal(groupsMade, 1);
  buf.destroy();
  assert.notEqual(device.createBindGroup(d), g, "the destroyed buffer's group was dropped");
  const before = process.env.VERL_WEBGPU_BIND_GROUP_CACHE;
  process.env.VERL_WEBGPU_BIND_GROUP_CACHE = "0";
  try {
    assert.equal(cacheBindGroups({ createBindGroup: () => ({}) }, Buffer), undefined);
  } finally {
    if (before === undefined) delete process.env.VERL_WEBGPU_BIND_GROUP_CACHE; else process.env.VERL_WEBGPU_BIND_GROUP_CACHE = before;
  }
});
