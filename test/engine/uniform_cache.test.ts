// Uniform buffers kept by content (src/engine/uniform_cache.ts), on a device object that hands out
// buffers and records writes and destroys: no GPU is needed for the bookkeeping. A block seen twice
// gets its own buffer, written once; a block seen once takes tfjs's pooled path; the bound evicts the
// least recently used, destroyed only after the next submit.
import { test } from "node:test";
import assert from "node:assert/strict";
import { UniformCache, cacheUniforms } from "../../src/engine/uniform_cache.js";
import { packUniforms, type SteppedUniform } from "../../src/engine/webgpu_replay.js";

interface Buf { id: number; size: number; destroyed: boolean; destroy(): void }

function fakeDevice() {
  const made: Buf[] = [], writes: { buffer: Buf; bytes: number[] }[] = [];
  const device = {
    createBuffer({ size }: { size: number; usage: number }): Buf {
      const b: Buf = { id: made.length, size, destroyed: false, destroy() { b.destroyed = true; } };
      made.push(b);
      return b;
    },
    queue: { writeBuffer(buffer: unknown, _off: number, data: ArrayBuffer) { writes.push({ buffer: buffer as Buf, bytes: [...new Int32Array(data)] }); } },
  };
  let pooled = 0;
  const pool = (values: SteppedUniform[]) => { pooled++; return { offset: 0, size: packUniforms(values).bytes.byteLength, buffer: { pooled } }; };
  return { device, made, writes, pool, pooledCount: () => pooled };
}

const block = (n: number): SteppedUniform[] => [{ type: "float32", data: [NaN] }, { type: "int32", data: [n, 7, 3] }, { type: "int32", data: [n * 2] }];

test("a block seen twice binds one buffer from then on, written once with tfjs's bytes", () => {
  const f = fakeDevice(), c = new UniformCache(f.device, f.pool);
  const first = c.make(block(5));
  assert.equal(f.pooledCount(), 1, "first sight: tfjs's pooled path");
  assert.equal(f.made.length, 0);
  const second = c.make(block(5)), third = c.make(block(5));
  assert.equal(f.made.length, 1, "second sight: a buffer of its own");
  assert.equal(second.buffer, third.buffer, "and the same buffer every time after");
  assert.notEqual(first.buffer, second.buffer);
  assert.equal(f.writes.length, 1, "written once");
  assert.deepEqual(f.writes[0]!.bytes, [...new Int32Array(packUniforms(block(5)).bytes)]);
  assert.equal(second.size, packUniforms(block(5)).bytes.byteLength);
  const other = c.make(block(6));
  assert.notEqual(other.buffer, second.buffer, "other bytes, another buffer");
  // -0 and 0 differ in their bits: two blocks
  c.make([{ type: "float32", data: [-0] }]); c.make([{ type: "float32", data: [-0] }]);
  c.make([{ type: "float32", data: [0] }]); c.make([{ type: "float32", data: [0] }]);
  assert.equal(f.made.length, 3);
  assert.deepEqual(c.stats, { hits: 1, stored: 3, pooled: 4, evicted: 0 });
});

test("the bound evicts the least recently used; its buffer is destroyed after the next submit, not before", () => {
  const f = fakeDevice(), c = new UniformCache(f.device, f.pool, 2);
  for (const n of [1, 1, 2, 2]) c.make(block(n));
  c.make(block(1)); // 1 is now the most recent
  c.make(block(3)); c.make(block(3)); // evicts 2
  assert.equal(c.size, 2);
  const two = f.made[1]!;
  assert.equal(two.destroyed, false, "still possibly in the commands being recorded");
  c.afterSubmit();
  assert.equal(two.destroyed, true);
  assert.equal(f.made[0]!.destroyed, false, "the recently used block stays");
  assert.equal(c.make(block(1)).buffer, f.made[0], "and is still found");
});

test("cacheUniforms wraps the backend's makeUniforms and submitQueue; VERL_WEBGPU_UNIFORM_CACHE=0 leaves them", () => {
  const f = fakeDevice();
  let submits = 0;
  const be = { device: f.device, makeUniforms: f.pool, submitQueue() { submits++; } };
  const before = process.env.VERL_WEBGPU_UNIFORM_CACHE;
  try {
    process.env.VERL_WEBGPU_UNIFORM_CACHE = "0";
    assert.equal(cacheUniforms({ ...be }), undefined);
    delete process.env.VERL_WEBGPU_UNIFORM_CACHE;
    const cache = cacheUniforms(be, 1)!;
    be.makeUniforms(block(1)); be.makeUniforms(block(1)); be.makeUniforms(block(2)); be.makeUniforms(block(2));
    assert.equal(cache.stats.evicted, 1);
    be.submitQueue();
    assert.equal(submits, 1);
    assert.equal(f.made[0]!.destroyed, true, "the evicted buffer went after the submit");
    assert.throws(() => cacheUniforms({ device: f.device } as never), /makeUniforms/);
  } finally {
    if (before === undefined) delete process.env.VERL_WEBGPU_UNIFORM_CACHE; else process.env.VERL_WEBGPU_UNIFORM_CACHE = before;
  }
});
