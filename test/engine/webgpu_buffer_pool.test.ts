// The cap on tfjs-backend-webgpu's free buffer lists (src/engine/webgpu_buffer_pool.ts), on tfjs's
// own BufferManager class: buffers of ever-new sizes (what the slot decoder and packed micro-batches
// ask for) stay bounded, fixed-size work keeps reusing its buffers with no trim. The manager talks
// to a device object that only hands out sized buffers and records destroy(): no GPU is needed for
// the bookkeeping tested here (tfjs-backend-webgpu installs on request; the test skips without it).
import { test } from "node:test";
import assert from "node:assert/strict";
import { capFreeBufferPool, freePoolLimits, nvidiaGpuMemoryBytes, DEFAULT_FREE_POOL_MB, POOL_BUDGET_SHARE_OF_GPU, sizeClass, sizeClassesEnabled, tensorBytes, SIZE_CLASS_MIN_BYTES } from "../../src/engine/webgpu_buffer_pool.js";

interface Buf { size: number; usage: number; destroyed: boolean; destroy(): void }
interface Manager {
  acquireBuffer(size: number, usage: number, mappedAtCreation?: boolean, reuse?: boolean): Buf;
  releaseBuffer(b: Buf, reuse?: boolean): void;
  numBytesAllocated: number; numBytesUsed: number; numFreeBuffers: number;
  freeBuffers: Map<string, Buf[]>;
}

async function tfjsBufferManager(): Promise<{ manager: Manager; created: Buf[] } | string> {
  let mod: { BufferManager: new (device: unknown) => Manager };
  try {
    mod = (await import("@tensorflow/tfjs-backend-webgpu/dist/buffer_manager.js" as string)) as typeof mod;
  } catch (e) {
    return `@tensorflow/tfjs-backend-webgpu is not installed (bash scripts/install-optional.sh webgpu): ${(e as Error).message.split("\n")[0]}`;
  }
  const created: Buf[] = [];
  const device = {
    createBuffer({ size, usage }: { size: number; usage: number }): Buf {
      const b: Buf = { size, usage, destroyed: false, destroy() { b.destroyed = true; } };
      created.push(b);
      return b;
    },
  };
  return { manager: new mod.BufferManager(device), created };
}

const STORAGE = 0x80 | 0x8 | 0x4; // STORAGE | COPY_DST | COPY_SRC, as tfjs asks for tensors

test("ever-new buffer sizes: the free lists stay under the cap, live buffers are never destroyed", async (t) => {
  const m = await tfjsBufferManager();
  if (typeof m === "string") return t.skip(m);
  const { manager, created } = m;
  const cap = 10_000;
  const stats = capFreeBufferPool(manager, cap);
  const live: Buf[] = [];
  for (let i = 0; i < 200; i++) {
    const b = manager.acquireBuffer(1000 + 4 * i, STORAGE);
    live.push(b);
    if (live.length > 3) manager.releaseBuffer(live.shift()!); // keep three in use, as a layer's tensors
    assert.ok(manager.numBytesAllocated - manager.numBytesUsed <= cap + 1000 + 4 * i, `step ${i}: ${manager.numBytesAllocated - manager.numBytesUsed} bytes parked`);
  }
  assert.ok(stats.trims > 0, "the cap was reached and trimmed");
  for (const b of live) assert.equal(b.destroyed, false, "a buffer in use was destroyed");
  const destroyed = created.filter((b) => b.destroyed).reduce((s, b) => s + b.size, 0);
  assert.equal(destroyed, stats.bytesDestroyed);
  assert.equal(manager.numBytesAllocated, created.filter((b) => !b.destroyed).reduce((s, b) => s + b.size, 0), "tfjs's byte count follows");
});

test("fixed sizes keep reusing their buffers and never trim", async (t) => {
  const m = await tfjsBufferManager();
  if (typeof m === "string") return t.skip(m);
  const { manager, created } = m;
  const stats = capFreeBufferPool(manager, 0); // even a zero cap: every acquire finds a free buffer of its size
  for (let step = 0; step < 50; step++) {
    const bs = [4096, 8192, 4096, 256].map((s) => manager.acquireBuffer(s, STORAGE));
    for (const b of bs) manager.releaseBuffer(b);
  }
  assert.equal(created.length, 4, "the first step's four buffers serve all 50 steps");
  assert.equal(stats.trims, 0, "no trim: every acquire after the first step finds a free buffer of its size");
});

test("a trim destroys the buffers parked longest: sizes every step reuses survive, sizes met once go", async (t) => {
  const m = await tfjsBufferManager();
  if (typeof m === "string") return t.skip(m);
  const { manager, created } = m;
  const stats = capFreeBufferPool(manager, 50_000, false); // exact sizes: with size classes the ever-new sizes reuse each other and never reach the cap
  for (let step = 0; step < 100; step++) {
    // activations of a new size (the trim happens here, with last step's buffers parked), then the
    // step's weights-shaped buffers (the same sizes every step)
    const once = manager.acquireBuffer(3000 + 8 * step, STORAGE);
    const fixed = [4096, 8192, 4096].map((s) => manager.acquireBuffer(s, STORAGE));
    for (const b of [...fixed, once]) manager.releaseBuffer(b);
  }
  assert.ok(stats.trims > 0, "the sizes met once filled the pool past the cap");
  const fixedMade = created.filter((b) => b.size === 4096 || b.size === 8192);
  assert.equal(fixedMade.length, 3, "the every-step buffers were made once and never destroyed");
  assert.ok(fixedMade.every((b) => !b.destroyed));
  assert.ok(manager.numBytesAllocated - manager.numBytesUsed <= 50_000 + 4096 * 2 + 8192 + 3000 + 8 * 99);
});

test("VERL_WEBGPU_FREE_POOL_MB: MiB >= 0, else an error naming the variable; a known GPU memory gives a budget instead", () => {
  const mib = (n: number) => n * 2 ** 20;
  assert.deepEqual(freePoolLimits(undefined), { capBytes: mib(DEFAULT_FREE_POOL_MB), budgetBytes: Infinity });
  // a known GPU memory sets a budget on all the pool holds (no cap on its free lists); the variable still wins
  assert.deepEqual(freePoolLimits(undefined, mib(81559)), { capBytes: Infinity, budgetBytes: Math.floor(mib(81559) * POOL_BUDGET_SHARE_OF_GPU) });
  assert.deepEqual(freePoolLimits("512", mib(143771)), { capBytes: mib(512), budgetBytes: Infinity });
  // nvidia-smi's csv, one line per GPU: the smallest; nothing usable: unknown
  assert.equal(nvidiaGpuMemoryBytes(() => "143771\n81559\n"), mib(81559));
  assert.equal(nvidiaGpuMemoryBytes(() => null), undefined);
  assert.equal(nvidiaGpuMemoryBytes(() => "[N/A]\n"), undefined);
  assert.equal(freePoolLimits("512").capBytes, mib(512));
  assert.equal(freePoolLimits("0").capBytes, 0);
  assert.throws(() => freePoolLimits("lots"), /VERL_WEBGPU_FREE_POOL_MB must be a number of MiB >= 0, got 'lots'/);
  assert.throws(() => freePoolLimits("-1"), /VERL_WEBGPU_FREE_POOL_MB/);
});

test("a budget on all the pool holds: a step's working set within it is made once however much lies free between its phases; past it, only the bytes needed go, oldest first", async (t) => {
  const m = await tfjsBufferManager();
  if (typeof m === "string") return t.skip(m);
  const { manager, created } = m;
  // a step in two phases whose buffers differ in size (forward activations, then optimizer-shaped
  // ones): between the phases most of the pool lies free, which a cap on the free lists trims
  const step = (mgr: Manager) => {
    const fwd = [40_000, 30_000, 20_000].map((s) => mgr.acquireBuffer(s, STORAGE));
    for (const b of fwd) mgr.releaseBuffer(b);
    const opt = [50_000, 50_000].map((s) => mgr.acquireBuffer(s, STORAGE));
    for (const b of opt) mgr.releaseBuffer(b);
  };
  const stats = capFreeBufferPool(manager, { capBytes: Infinity, budgetBytes: 200_000 }, false);
  for (let i = 0; i < 20; i++) step(manager);
  assert.equal(created.length, 5, "the five buffers of the first step serve all twenty");
  assert.equal(stats.trims, 0);
  // the same steps under a cap of 60,000 bytes on the free lists: made again every step
  const other = await tfjsBufferManager();
  if (typeof other === "string") return t.skip(other);
  const capped = capFreeBufferPool(other.manager, 60_000, false);
  for (let i = 0; i < 20; i++) step(other.manager);
  assert.ok(capped.trims >= 19 && other.created.length >= 60, `${capped.trims} trims, ${other.created.length} buffers made`);
  // past the budget: a buffer that does not fit destroys the buffers parked longest, only as many as it needs
  const big = manager.acquireBuffer(80_000, STORAGE); // 190,000 held + 80,000 > 200,000: 70,000 bytes must go
  assert.equal(stats.trims, 1);
  const gone = created.filter((b) => b.destroyed);
  assert.deepEqual(gone.map((b) => b.size), [40_000, 30_000], "the forward phase's buffers, parked longest, and no more than needed");
  assert.ok(manager.numBytesAllocated <= 200_000, `${manager.numBytesAllocated} bytes held`);
  assert.equal(big.destroyed, false);
  manager.releaseBuffer(big);
});

test("size classes: at most 12.5% more, multiples of 4, a class maps to itself, exact below the threshold", () => {
  assert.equal(sizeClass(SIZE_CLASS_MIN_BYTES), SIZE_CLASS_MIN_BYTES);
  assert.equal(sizeClass(200), 200);
  assert.equal(sizeClass(1000), 1024);
  assert.equal(sizeClass(4100), 4608); // 4096 + 512
  assert.equal(sizeClass(2 ** 20 + 4), 2 ** 20 + 2 ** 17);
  for (let s = 4; s < 3e7; s = Math.ceil(s * 1.37 / 4) * 4) {
    const c = sizeClass(s);
    assert.ok(c >= s && c <= s * 1.125, `${s} -> ${c}`);
    assert.equal(c % 4, 0);
    assert.equal(sizeClass(c), c, `class ${c} is stable`);
  }
  assert.equal(sizeClassesEnabled(undefined), true);
  assert.equal(sizeClassesEnabled("0"), false);
  assert.throws(() => sizeClassesEnabled("yes"), /VERL_WEBGPU_SIZE_CLASSES/);
});

test("size classes: nearby storage sizes reuse one parked buffer; uniform and mapped buffers stay exact", async (t) => {
  const m = await tfjsBufferManager();
  if (typeof m === "string") return t.skip(m);
  const { manager, created } = m;
  const stats = capFreeBufferPool(manager, 1e9, true);
  for (const size of [40_000, 40_400, 39_000, 40_960]) manager.releaseBuffer(manager.acquireBuffer(size, STORAGE));
  assert.equal(stats.created, 1, "one buffer of the class 40960 serves all four");
  assert.equal(created[0].size, 40_960);
  const UNIFORM = 0x40 | 0x8, MAP_READ = 0x1 | 0x8;
  assert.equal(manager.acquireBuffer(40_000, UNIFORM).size, 40_000);
  assert.equal(manager.acquireBuffer(40_000, MAP_READ).size, 40_000);
  const b = manager.acquireBuffer(40_004, STORAGE);
  assert.equal(b.size, 40_960);
  assert.equal(tensorBytes(b), 40_004, "the tensor's bytes are recorded");
  assert.equal(manager.numBytesUsed, 40_000 * 2 + 40_960, "tfjs's counts use the rounded size");
  manager.releaseBuffer(b);
  const off = await tfjsBufferManager();
  if (typeof off === "string") return;
  const offStats = capFreeBufferPool(off.manager, 1e9, false);
  for (const size of [40_000, 40_400]) off.manager.releaseBuffer(off.manager.acquireBuffer(size, STORAGE));
  assert.equal(offStats.created, 2, "switched off: exact sizes as before");
});

test("a size's free buffers are handed out oldest first, whatever order they came back in, so a loop's steps bind the same buffers", async (t) => {
  const m = await tfjsBufferManager();
  if (typeof m === "string") return t.skip(m);
  const { manager } = m;
  capFreeBufferPool(manager, 1 << 30);
  const seen: Buf[][] = [];
  for (let step = 0; step < 6; step++) {
    // three live buffers of one size, released in an order that changes every step (as tfjs's deferred
    // disposal after each submit gives), then asked for again
    const bs = [0, 1, 2].map(() => manager.acquireBuffer(4096, STORAGE));
    seen.push(bs);
    const order = step % 2 ? [bs[2]!, bs[0]!, bs[1]!] : [bs[1]!, bs[2]!, bs[0]!];
    for (const b of order) manager.releaseBuffer(b);
  }
  const ids = seen.map((bs) => bs.map((b) => m.created.indexOf(b)));
  assert.deepEqual(ids[0], [0, 1, 2]);
  for (let step = 1; step < ids.length; step++) assert.deepEqual(ids[step], ids[0], `step ${step}: the same buffer for each of the step's tensors`);
});
