// ZeRO-1: DataParallelOptimizer with its state sharded over the ranks (each updates one slice of
// the flat parameter vector, the slices all-gathered) gives the replicated optimizer's bits:
// parameters, gradient norms (clipped and not), skipped steps and the scalars riding along, on
// the cpu and wasm backends, over 2 and 4 ranks and hybrid (4 ranks, 2 shards). Checkpoints save
// each shard's slice and load into any sharding or world size.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ClassWithInitArgs, WorkerGroup } from "../../../src/single_controller/index.js";
import { SHAPES, type ZeroResult, type ZeroSpec } from "../../single_controller/fixtures/zero_worker.js";
import { fixture, withPool } from "../../single_controller/helpers.js";
import { webgpuOrReason } from "../../engine/webgpu_adapter.js";

const NUMEL = SHAPES.reduce((a, s) => a + s.reduce((x, y) => x * y, 1), 0);
const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("hex");

async function train(world: number, specs: ZeroSpec[], directMaxBytes?: number): Promise<ZeroResult[][]> {
  return withPool({ worldSize: world, ...(directMaxBytes !== undefined ? { directMaxBytes } : {}) }, async (pool) => {
    const wg = (await WorkerGroup.create(pool, new ClassWithInitArgs(fixture("zero_worker"), "ZeroWorker"))) as unknown as { train(s: ZeroSpec): Promise<ZeroResult[]> };
    const out: ZeroResult[][] = [];
    for (const s of specs) out.push(await wg.train(s));
    return out;
  }, 60_000);
}

function assertSameBits(got: ZeroResult[], want: ZeroResult[], what: string): void {
  for (const [r, x] of got.entries()) {
    assert.equal(bits(x.params), bits(want[r]!.params), `${what}: rank ${r} parameters`);
    assert.deepEqual(x.norms, want[r]!.norms, `${what}: rank ${r} gradient norms`);
    assert.deepEqual(x.skipped, want[r]!.skipped, `${what}: rank ${r} skipped steps`);
    assert.deepEqual(x.scalars, want[r]!.scalars, `${what}: rank ${r} scalars`);
    assert.equal(x.leaked, 0, `${what}: rank ${r} left tensors behind`);
  }
}

/** The moments of all ranks' slices laid end to end (the first rank holding each offset). */
function fullMoments(res: ZeroResult[]): { m: Float32Array; v: Float32Array } {
  const m = new Float32Array(NUMEL).fill(NaN), v = new Float32Array(NUMEL).fill(NaN);
  for (const x of res) {
    m.set(x.expAvg, x.range[0]);
    v.set(x.expAvgSq, x.range[0]);
  }
  return { m, v };
}

for (const backend of ["cpu", "wasm"]) {
  test(`ZeRO-1 on ${backend}: sharded over 2 and 4 ranks and hybrid give the replicated optimizer's bits`, { timeout: 120_000 }, async () => {
    const steps = [0, 1, 2, 3, 4, 5];
    const [two1, two2] = await train(2, [1, 2].map((shards) => ({ backend, shards, steps, nanStep: 2 })));
    assert.deepEqual(two1![0]!.skipped, [false, false, true, false, false, false], "a NaN on one rank skips the step everywhere");
    assert.ok(two1![0]!.norms.some((n) => n > 1) && two1![0]!.norms.some((n) => n < 1), `the clip acts on some steps only: ${two1![0]!.norms}`);
    assert.equal(bits(two1![0]!.params), bits(two1![1]!.params), "replicas agree");
    assertSameBits(two2!, two1!, `${backend}, 2 ranks, 2 shards`);
    assert.deepEqual(two2!.map((x) => x.range), [[0, 41], [41, 82]]);

    const four = await train(4, [1, 2, 4].map((shards) => ({ backend, shards, steps, nanStep: 2 })));
    assertSameBits(four[1]!, four[0]!, `${backend}, 4 ranks, 2 shards (hybrid)`);
    assertSameBits(four[2]!, four[0]!, `${backend}, 4 ranks, 4 shards`);
    // optimizer state per rank: the whole vector replicated, a half or a quarter sharded
    assert.deepEqual(four.map((run) => run.map((x) => x.stateBytes)), [[1, 1, 1, 1].map(() => 8 * NUMEL), [41, 41, 41, 41].map((n) => 8 * n), [21, 21, 20, 20].map((n) => 8 * n)]);
    assert.deepEqual(four[1]!.map((x) => x.range), [[0, 41], [41, 82], [0, 41], [41, 82]], "hybrid: rank r holds shard r % 2");
    const whole = fullMoments(four[0]!.slice(0, 1)), sharded = fullMoments(four[2]!);
    assert.equal(bits(sharded.m), bits(whole.m), "the shards' first moments are the replicated optimizer's");
    assert.equal(bits(sharded.v), bits(whole.v), "the shards' second moments are the replicated optimizer's");
  });
}

/** A run's outputs on every rank (parameters, norms, skips, scalars, moments) as one digest. */
function digest(res: ZeroResult[]): string {
  const h = createHash("sha256");
  for (const x of res) {
    for (const a of [x.params, Float64Array.from(x.norms), Uint8Array.from(x.skipped.map(Number)), Float64Array.from(x.scalars), x.expAvg, x.expAvgSq]) {
      h.update(Buffer.from(a.buffer, a.byteOffset, a.byteLength));
    }
  }
  return h.digest("hex").slice(0, 24);
}

// Recorded from the build before the direct path (commit 2fd3e5e's collective and optimizer, this
// fixture, cpu; wasm gave the same digests): steps 0-5, a NaN on rank 0 at step 2.
const BEFORE_DIRECT: [world: number, shards: number, gradScale: number, digest: string][] = [
  [2, 1, 1, "c2e09f49fcc3316270c4f944"],
  [2, 2, 0.75, "f81138c5b2e3b847d92a0aa6"],
  [3, 3, 0.75, "a832105fb4e906a206e38544"],
  [4, 2, 0.75, "737608ff1717e7c5d95bbace"],
];

test("the optimizer step through the collective's direct path gives the chunked path's and the earlier build's bits", { timeout: 180_000 }, async () => {
  for (const [world, shards, gradScale, want] of BEFORE_DIRECT) {
    const spec = { backend: "cpu", shards, steps: [0, 1, 2, 3, 4, 5], nanStep: 2, gradScale };
    const [direct] = await train(world, [spec]);
    const [chunked] = await train(world, [spec], 0);
    const what = `${world} ranks, ${shards} shard(s), gradScale ${gradScale}`;
    // every step's gradient reduce went direct (and, sharded, each gather but the skipped step's)
    assert.deepEqual(direct![0]!.collectiveOps, { direct: shards > 1 ? 11 : 6, chunked: 6 }, `${what}: direct ops`);
    assert.deepEqual(chunked![0]!.collectiveOps, { direct: 0, chunked: shards > 1 ? 17 : 12 }, `${what}: with directMaxBytes 0 every op went through the scratch`);
    assert.equal(digest(direct!), want, `${what}: direct path, the earlier build's bits`);
    assert.equal(digest(chunked!), want, `${what}: chunked path, the earlier build's bits`);
  }
});

test("sharded checkpoints: each shard saves its slice; a resume in another sharding or world size re-slices the moments", { timeout: 120_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-zero-"));
  try {
    const backend = "wasm";
    const [uninterrupted, firstHalf] = await train(4, [
      { backend, shards: 1, steps: [0, 1, 2, 3, 4] },
      { backend, shards: 4, steps: [0, 1, 2], saveTo: join(dir, "s4") },
    ]);
    for (let r = 0; r < 4; r++) assert.ok(existsSync(join(dir, "s4", `optim_world_size_4_rank_${r}.safetensors`)), `shard ${r} saved`);
    assert.ok(!existsSync(join(dir, "s4", "optim.safetensors")), "no replicated file beside the shards");
    assert.equal(JSON.parse(readFileSync(join(dir, "s4", "checkpoint_meta.json"), "utf8")).optimizer_shards, 4);

    // Same world size, other shardings: the remaining steps give the uninterrupted run's bits.
    const [hybrid, replicated] = await train(4, [
      { backend, shards: 2, steps: [3, 4], loadFrom: join(dir, "s4"), saveTo: join(dir, "h2") },
      { backend, shards: 1, steps: [3, 4], loadFrom: join(dir, "s4") },
    ]);
    // the uninterrupted run's last two steps (two scalars ride along per step)
    const lastTwo = uninterrupted!.map((x) => ({ ...x, norms: x.norms.slice(3), skipped: x.skipped.slice(3), scalars: x.scalars.slice(6) }));
    assertSameBits(hybrid!, lastTwo, "resumed 4 -> 2 shards");
    assertSameBits(replicated!, lastTwo, "resumed 4 -> replicated");
    // hybrid: two files, written by the first group
    assert.ok(existsSync(join(dir, "h2", "optim_world_size_2_rank_1.safetensors")) && !existsSync(join(dir, "h2", "optim_world_size_2_rank_2.safetensors")));

    // Another world size: the moments are the saved ones, re-sliced (2 ranks, 2 shards; 3 ranks, 3 shards).
    const saved = fullMoments(firstHalf!);
    for (const world of [2, 3]) {
      const [loaded] = await train(world, [{ backend, shards: world, steps: [], loadFrom: join(dir, "s4") }]);
      const got = fullMoments(loaded!);
      assert.equal(bits(got.m), bits(saved.m), `${world} ranks: first moments`);
      assert.equal(bits(got.v), bits(saved.v), `${world} ranks: second moments`);
      assert.ok(loaded!.every((x) => x.step === 3), "optimizer step restored");
    }
    // A missing shard file is named.
    rmSync(join(dir, "s4", "optim_world_size_4_rank_2.safetensors"));
    await assert.rejects(train(2, [{ backend, shards: 2, steps: [], loadFrom: join(dir, "s4") }]), /optim_world_size_4_rank_2\.safetensors is missing \(the optimizer was saved in 4 shards\)/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("two ranks on WebGPU: the gradient read back and the parameters uploaded directly (webgpu_transfer.ts) give tfjs's transfers' bits, sharded or not", { timeout: 180_000 }, async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const steps = [0, 1, 2, 3];
  const run = async (direct: boolean) => {
    const saved = [process.env.VERL_WEBGPU_DIRECT_READ, process.env.VERL_WEBGPU_DIRECT_WRITE];
    // the rank threads copy the environment when the pool starts them
    process.env.VERL_WEBGPU_DIRECT_READ = process.env.VERL_WEBGPU_DIRECT_WRITE = direct ? "1" : "0";
    try {
      return await train(2, [1, 2].map((shards) => ({ backend: "webgpu", shards, steps, nanStep: 2 })));
    } finally {
      for (const [k, v] of [["VERL_WEBGPU_DIRECT_READ", saved[0]], ["VERL_WEBGPU_DIRECT_WRITE", saved[1]]] as const) {
        if (v === undefined) delete process.env[k]; else process.env[k] = v;
      }
    }
  };
  const [direct, viaTfjs] = [await run(true), await run(false)];
  assert.deepEqual(direct[0]![0]!.skipped, [false, false, true, false], "a NaN on one rank skips the step everywhere");
  for (const res of [...direct, ...viaTfjs]) assert.ok(res.every((x) => x.deviceReduce.every(Boolean)), "the gradients were summed on the device");
  assert.equal(bits(direct[0]![0]!.params), bits(direct[0]![1]!.params), "replicas agree");
  assertSameBits(direct[1]!, direct[0]!, "direct, 2 shards against replicated");
  assertSameBits(direct[0]!, viaTfjs[0]!, "replicated: direct against tfjs's transfers");
  assertSameBits(direct[1]!, viaTfjs[1]!, "2 shards: direct against tfjs's transfers");
});

test("two ranks on WebGPU: the gradient summed on the device (dp_device_reduce.ts) against the host sum, sharded and replicated, with a loss scale", { timeout: 180_000 }, async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  const steps = [0, 1, 2, 3, 4, 5];
  const run = async (device: boolean) => {
    const saved = process.env.VERL_WEBGPU_DEVICE_REDUCE;
    process.env.VERL_WEBGPU_DEVICE_REDUCE = device ? "1" : "0"; // the rank threads copy the environment when the pool starts them
    try {
      return await train(2, [1, 2].map((shards) => ({ backend: "webgpu", shards, steps, nanStep: 3, gradScale: 0.5 })));
    } finally {
      if (saved === undefined) delete process.env.VERL_WEBGPU_DEVICE_REDUCE; else process.env.VERL_WEBGPU_DEVICE_REDUCE = saved;
    }
  };
  const [device, host] = [await run(true), await run(false)];
  for (const [i, what] of ["replicated", "2 shards"].entries()) {
    const d = device[i]!, h = host[i]!;
    for (const [r, x] of d.entries()) {
      assert.ok(x.deviceReduce.every(Boolean), `${what}: rank ${r} summed on the device`);
      assert.ok(h[r]!.deviceReduce.every((b) => !b), `${what}: rank ${r} summed on the host with VERL_WEBGPU_DEVICE_REDUCE=0`);
      assert.deepEqual(x.skipped, [false, false, false, true, false, false], `${what}: the NaN step skipped on every rank`);
      assert.deepEqual(x.skipped, h[r]!.skipped);
      assert.deepEqual(x.scalars, h[r]!.scalars, `${what}: rank ${r} scalars (float32 sums either way)`);
      x.norms.forEach((nrm, k) => {
        if (x.skipped[k]) return assert.ok(!Number.isFinite(nrm) && !Number.isFinite(h[r]!.norms[k]!));
        // the device adds the squares in float32 (a fixed tree), the host in float64
        assert.ok(Math.abs(nrm - h[r]!.norms[k]!) <= 1e-6 * h[r]!.norms[k]!, `${what}: step ${k} norm ${nrm} against ${h[r]!.norms[k]}`);
      });
      let worst = 0;
      x.params.forEach((p, k) => { worst = Math.max(worst, Math.abs(p - h[r]!.params[k]!)); });
      assert.ok(worst <= 1e-6, `${what}: rank ${r} parameters within 1e-6 of the host sum's (${worst}; they differ only through a clip coefficient's last bits)`);
      assert.equal(x.leaked, 0, `${what}: rank ${r} left tensors behind`);
    }
  }
  // the device path's own promise: sharded and replicated give the same bits (norms from the same per-rank partials)
  assertSameBits(device[1]!, device[0]!, "device sum, 2 shards against replicated");
  assert.equal(bits(device[1]![0]!.params), bits(device[1]![1]!.params), "the ranks' parameters agree after the gather");
});
