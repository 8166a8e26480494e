// actor_rollout_ref.rollout.skip_rollout / skip_dump_dir (verl's RolloutSkip): the first training
// rollout is dumped, then every step (and every later run with the same file name) loads it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { DataProto } from "../../../../src/protocol/index.js";
import { tensor } from "../../../../src/protocol/tensor.js";
import { readRolloutDump, RolloutSkip, writeRolloutDump } from "../../../../src/trainer/ppo/rollout_skip.js";
import { makeWorkspace, runTrain, scratchModel } from "./fixtures.js";

const proto = (rows: number, width: number, base: number, extra: Record<string, unknown[]> = {}) =>
  new DataProto({ input_ids: tensor(Int32Array.from({ length: rows * width }, (_, i) => base + i), [rows, width], "int32") }, extra, { step: base });

test("a rollout dump reads back equal: tensors with dtype and shape, nested non-tensor values, meta info", () => {
  const dir = mkdtempSync(join(tmpdir(), "rollout-skip-"));
  try {
    const skip = new RolloutSkip(dir, "exp", "proj", 2, 3);
    assert.equal(skip.file, join(dir, "exp_proj_GBS2__N3"));
    const rec = {
      prompts: proto(2, 4, 100, { reward_model: [{ ground_truth: "7" }, { ground_truth: "9" }], uid: ["a", "b"] }),
      gen: proto(6, 4, 200),
      out: new DataProto({ responses: tensor(new Float32Array(6 * 300).map((_, i) => i / 7), [6, 300], "float32"), mask: tensor(new Uint8Array(6).fill(1), [6, 1], "bool") },
        { raw_prompt: Array.from({ length: 6 }, (_, i) => [{ role: "user", content: `q${i}` }]) }, { metrics: { m: [1, 2] } }),
    };
    writeRolloutDump(join(dir, "f"), rec);
    const back = readRolloutDump(join(dir, "f"));
    for (const part of ["prompts", "gen", "out"] as const) {
      assert.deepEqual(Object.keys(back[part].batch).sort(), Object.keys(rec[part].batch).sort(), part);
      for (const [k, t] of Object.entries(rec[part].batch)) {
        const b = back[part].batch[k]!;
        assert.equal(b.dtype, t.dtype, `${part}.${k} dtype`);
        assert.deepEqual(b.shape, t.shape, `${part}.${k} shape`);
        assert.deepEqual([...b.data], [...t.data], `${part}.${k} values`);
      }
      assert.deepEqual(back[part].nonTensorBatch, rec[part].nonTensorBatch);
      assert.deepEqual(back[part].metaInfo, rec[part].metaInfo);
    }
    writeFileSync(join(dir, "junk"), "not a dump");
    assert.throws(() => readRolloutDump(join(dir, "junk")), /rollout dump .*junk cannot be read .*skip_dump_dir/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("RolloutSkip: generates and dumps once, then returns the dump (fresh copies); a dump of another shape is refused by name", async () => {
  const dir = join(mkdtempSync(join(tmpdir(), "rollout-skip-")), "not-yet");
  try {
    let calls = 0;
    const generate = async () => { calls++; return proto(4, 3, 1000 * calls); };
    const skip = new RolloutSkip(dir, "", "", 2, 2);
    const first = await skip.rollout({ prompts: proto(2, 1, 1), gen: proto(4, 5, 10), out: new DataProto() }, generate);
    assert.equal(first.loaded, false);
    assert.ok(existsSync(join(dir, "__GBS2__N2")));
    const second = await skip.rollout({ prompts: proto(2, 1, 50), gen: proto(4, 5, 60), out: new DataProto() }, generate);
    assert.equal(calls, 1, "the second step loads instead of generating");
    assert.equal(second.loaded, true);
    assert.deepEqual([...second.out.batch.input_ids!.data], [...first.out.batch.input_ids!.data]);
    assert.deepEqual([...second.prompts.batch.input_ids!.data], [1, 2], "the dumped prompts replace the step's");
    second.out.batch.input_ids!.data[0] = -1;
    first.out.batch.input_ids!.data[1] = -1;
    const again = await skip.rollout({ prompts: proto(2, 1, 0), gen: proto(4, 5, 0), out: new DataProto() }, generate);
    assert.deepEqual([again.out.batch.input_ids!.data[0], again.out.batch.input_ids!.data[1]], [1000, 1001], "steps get copies, not the cached arrays (nor the first step's)");
    const third = await new RolloutSkip(dir, "", "", 2, 2).rollout({ prompts: proto(2, 1, 0), gen: proto(4, 5, 0), out: new DataProto() }, generate);
    assert.equal(calls, 1, "a later run with the same file name loads too");
    assert.equal(third.out.batch.input_ids!.data[0], 1000);
    await assert.rejects(
      new RolloutSkip(dir, "", "", 2, 2).rollout({ prompts: proto(2, 1, 0), gen: proto(4, 7, 0), out: new DataProto() }, generate),
      /rollout dump .*__GBS2__N2 does not fit this run: its 'input_ids' has shape \[4, 5\], this run's \[4, 7\]/,
    );
  } finally {
    rmSync(dirname(dir), { recursive: true, force: true });
  }
});

const jsonl = (p: string) => readFileSync(p, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { input: string; output: string; gts: unknown; score: number });

test("verl train with skip_rollout: step 2 trains on step 1's rollout, and a later run with another seed loads it", async () => {
  const ws = await makeWorkspace();
  try {
    const skipDir = join(ws.dir, "skip");
    const base = [...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2",
      "actor_rollout_ref.rollout.skip_rollout=true", `actor_rollout_ref.rollout.skip_dump_dir=${skipDir}`];
    const first = await runTrain([...base, `trainer.rollout_data_dir=${ws.dir}/d1`, `trainer.default_local_dir=${ws.dir}/c1`], {});
    assert.equal(first.code, 0, first.stderr);
    assert.deepEqual(readdirSync(skipDir), ["e_t_GBS4__N2"], "{experiment}_{project}_GBS{train_batch_size}__N{n}");
    const s1 = jsonl(join(ws.dir, "d1/1.jsonl")), s2 = jsonl(join(ws.dir, "d1/2.jsonl"));
    assert.equal(s1.length, 8);
    assert.deepEqual(s2.map((r) => [r.input, r.output, r.gts]), s1.map((r) => [r.input, r.output, r.gts]), "step 2 replays step 1's prompts and responses");
    assert.match(first.stdout + first.stderr, /the step's rollout was loaded, not generated/);

    // another seed and data order would generate different text; the dump wins
    const second = await runTrain([...base, "trainer.seed=99", "data.seed=11", `trainer.rollout_data_dir=${ws.dir}/d2`, `trainer.default_local_dir=${ws.dir}/c2`], {});
    assert.equal(second.code, 0, second.stderr);
    const r1 = jsonl(join(ws.dir, "d2/1.jsonl"));
    assert.deepEqual(r1.map((r) => [r.input, r.output]), s1.map((r) => [r.input, r.output]));
    assert.deepEqual(r1.map((r) => r.score), s1.map((r) => r.score), "scored against the dumped prompts' own ground truth");
    const fresh = await runTrain([...base.filter((o) => !o.startsWith("actor_rollout_ref.rollout.skip")), "trainer.total_training_steps=1", "trainer.seed=99", "data.seed=11",
      `trainer.rollout_data_dir=${ws.dir}/d3`, `trainer.default_local_dir=${ws.dir}/c3`], {});
    assert.equal(fresh.code, 0, fresh.stderr);
    assert.notDeepEqual(jsonl(join(ws.dir, "d3/1.jsonl")).map((r) => [r.input, r.output]), s1.map((r) => [r.input, r.output]),
      "without skipping, that seed generates something else (so the equality above is the dump's doing)");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
