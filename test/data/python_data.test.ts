// verl's Python data classes run through the bridge (src/data/python_bridge.ts): a curriculum
// sampler in `verl train`, a dataset class's rows mapped to verl-ts rows, and every way user code
// can fail (import error, raising __getitem__, a hang, no python3, no transformers), and the round
// trips a batch costs (one call for its rows, one for its sampler indices; `node --test` prints the timings).
// The python3 here has no transformers, so most dataset tests put a small stand-in `transformers`
// package on PYTHONPATH (test/data/fixtures/fake_transformers: from_pretrained records the path and
// nothing else); the real library is exercised by the last test, which needs VERL_PYTHON pointing
// at a python3 with transformers installed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRLDataloaders, loadCustomDatasetClass, loadSamplerClass, writeParquet } from "../../src/data/index.js";
import type { PythonDataset } from "../../src/data/python_bridge.js";
import { loadTokenizer } from "../../src/models/tokenizers/index.js";
import { DataProto } from "../../src/protocol/index.js";
import { tensor } from "../../src/protocol/tensor.js";
import { makeWorkspace, runTrain, scratchModel } from "../trainer/ppo/trainer/fixtures.js";

// the sources stay in test/ (tsc copies no .py files to dist)
const SRC_TEST = fileURLToPath(new URL("../../../test/data/", import.meta.url));
const FAKE_TRANSFORMERS = join(SRC_TEST, "fixtures", "fake_transformers");
const QWEN_FIXTURE = fileURLToPath(new URL("../../../test/models/fixtures/families/qwen2_sliding", import.meta.url));

const hasPython = spawnSync("python3", ["--version"]).status === 0;
const noPython = hasPython ? false : "python3 is not on PATH";

/** Runs fn with environment variables set (the bridge's worker copies the environment when it starts). */
function withEnv<T>(vars: Record<string, string | undefined>, fn: () => T): T {
  const old = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const set = (v: Record<string, string | undefined>) => { for (const [k, x] of Object.entries(v)) if (x === undefined) delete process.env[k]; else process.env[k] = x; };
  set(vars);
  try {
    return fn();
  } finally {
    set(old);
  }
}

const SAMPLERS = `
import sys
from verl.experimental.dataset.sampler import AbstractCurriculumSampler, AbstractSampler


class Curriculum(AbstractCurriculumSampler):
    """Walks the rows by data.sampler.step; update() jumps to the row after the batch's hardest index."""

    def __init__(self, data_source, data_config):
        self.rows = data_source
        self.n = len(data_source)
        self.step = data_config.sampler.get("step", 1)
        self.first = data_source[0]["prompt"][0]["content"]
        self.cursor = 0
        self.seen = []

    def __len__(self):
        return 4

    def __iter__(self):
        for _ in range(4):
            i = self.cursor
            self.cursor = (i + self.step) % self.n
            yield i

    def update(self, batch):
        idx = [int(x) for x in batch.non_tensor_batch["index"]]
        scores = batch.batch["scores"]
        rows = [[float(v) for v in r] for r in scores]
        self.seen.append({"size": len(batch), "index": idx, "scores": rows, "meta": dict(batch.meta_info), "first": self.first})
        self.cursor = (max(idx) + 1) % self.n

    def state_dict(self):
        return {"cursor": self.cursor, "seen": self.seen}

    def load_state_dict(self, state):
        self.cursor = state["cursor"]


class NotASampler:
    def __init__(self, data_source, data_config):
        pass

    def __iter__(self):
        return iter([0])


class BadIter(AbstractSampler):
    def __init__(self, data_source, data_config):
        self.n = len(data_source)

    def __iter__(self):
        yield 0
        raise ValueError("ran out of curriculum")


class Hang(AbstractSampler):
    def __init__(self, data_source, data_config):
        import time
        time.sleep(3600)
`;

const DATASETS = `
try:
    from torch.utils.data import Dataset
except ImportError:
    Dataset = object


class Rows(Dataset):
    """Rows in the shapes verl's datasets return: raw_prompt messages, or token ids only (older verl)."""

    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        assert processor is None
        self.tokenizer_path = tokenizer.name_or_path
        self.files = list(data_files)
        self.n = config.datagen.n if max_samples < 0 else max_samples
        self.key = config.get("prompt_key", "prompt")

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == 2:
            return {"raw_prompt_ids": [5, 6, 7], "data_source": "ids", "extra_info": {"index": 20}}
        if i == 3:
            return {"input_ids": [[0, 0, 8, 9]], "attention_mask": [[0, 0, 1, 1]], "position_ids": [[0, 0, 0, 1]], "data_source": "padded"}
        return {
            "raw_prompt": [{"role": "user", "content": f"q{i} from {self.tokenizer_path}"}],
            "data_source": self.files[0],
            "reward_model": {"ground_truth": str(i), "score": 0.5},
            "extra_info": {"index": 10 + i, "tools_kwargs": {"calc": {"x": i}}},
            "dummy_tensor": [0],
        }


class Broken(Dataset):
    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        pass

    def __len__(self):
        return 5

    def __getitem__(self, i):
        if i == 1:
            raise KeyError("no such question")
        if i == 2:
            import time
            time.sleep(3600)
        if i == 3:
            return {"raw_prompt": [{"role": "user", "content": "look"}], "multi_modal_data": {"image": ["x.png"]}}
        if i == 4:
            import os
            os._exit(3)
        return {"raw_prompt": [{"role": "user", "content": "fine"}]}
`;

const BATCHED = `
import time
from verl.experimental.dataset.sampler import AbstractSampler

try:
    from torch.utils.data import Dataset
except ImportError:
    Dataset = object


class Many(Dataset):
    """data.datagen.n rows; calls counts __getitem__; datagen.slow: seconds a row; rows hang_at / raise_at / exit_at
    hang, raise, end the process; raise_at=-2: row 5 is no dict."""

    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        self.n = config.datagen.n
        self.slow = config.datagen.get("slow", 0)
        self.raise_at = config.datagen.get("raise_at", -1)
        self.hang_at = config.datagen.get("hang_at", -1)
        self.exit_at = config.datagen.get("exit_at", -1)
        self.calls = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        if self.slow:
            time.sleep(self.slow)
        if i == self.hang_at:
            time.sleep(3600)
        if i == self.exit_at:
            import os
            os._exit(3)
        if i == self.raise_at:
            raise IndexError(f"row {i} is cursed")
        if i == 5 and self.raise_at == -2:
            return ["not", "a", "dict"]
        return {"raw_prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "many", "extra_info": {"index": i, "calls": self.calls}}


class Stride(AbstractSampler):
    """Every row once, in steps of 7; state_dict tells how many indices were drawn (none ahead of need)."""

    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.drawn = 0

    def __iter__(self):
        for k in range(self.n):
            self.drawn += 1
            yield (7 * k) % self.n

    def state_dict(self):
        return {"drawn": self.drawn}

    def load_state_dict(self, state):
        pass


class ReadsAll(AbstractSampler):
    """Reads verl-ts's whole dataset by iteration and a slice: a few callbacks, not one per row."""

    def __init__(self, data_source, data_config):
        self.openings = [r["prompt"][0]["content"] for r in data_source]
        assert [r["prompt"][0]["content"] for r in data_source[1:3]] == self.openings[1:3]
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n))
`;

const SEES_DATASET = `
from verl.experimental.dataset.sampler import AbstractSampler


class SeesDataset(AbstractSampler):
    """A sampler over a Python dataset gets that very object (not copies of its rows)."""

    def __init__(self, data_source, data_config):
        self.kind = type(data_source).__name__
        self.n = len(data_source)

    def __iter__(self):
        assert self.kind == "Rows", self.kind
        return iter(range(self.n - 1, -1, -1))
`;

async function workspace(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "py-data-"));
  const rows = ["one", "two", "three", "four", "five"].map((t, i) => ({
    data_source: "s", prompt: [{ role: "user", content: t }], reward_model: { ground_truth: String(i) }, extra_info: { index: i },
  }));
  await writeParquet(join(dir, "d.parquet"), rows);
  writeFileSync(join(dir, "samplers.py"), SAMPLERS);
  writeFileSync(join(dir, "datasets.py"), DATASETS);
  writeFileSync(join(dir, "sees.py"), SEES_DATASET);
  writeFileSync(join(dir, "batched.py"), BATCHED);
  writeFileSync(join(dir, "bad_import.py"), "import numpy_that_is_not_there\n");
  return dir;
}

const data = (dir: string, extra: Record<string, unknown>) => ({
  train_files: [join(dir, "d.parquet")], val_files: [join(dir, "d.parquet")], train_batch_size: 2, max_prompt_length: 16,
  shuffle: false, filter_overlong_prompts: false, dataloader_num_workers: 0, ...extra,
});

const sampler = (dir: string, name: string, extra: Record<string, unknown> = {}) =>
  data(dir, { sampler: { class_path: join(dir, "samplers.py"), class_name: name, step: 2 }, ...extra });

test("data.sampler in Python: indices a batch at a time, update() sees the trained batch's columns and steers the next batch, state round-trips", { skip: noPython }, async () => {
  const dir = await workspace();
  try {
    const d = sampler(dir, "Curriculum");
    const l = createRLDataloaders(d, null, { samplerClass: await loadSamplerClass(d) });
    try {
      assert.equal(l.train.length, 2, "the sampler's len() (4) in batches of 2");
      const idx = (b: DataProto) => (b.nonTensorBatch.extra_info as { index: number }[]).map((e) => e.index);
      const it = l.train[Symbol.iterator]();
      const b1 = it.next().value as DataProto;
      assert.deepEqual(idx(b1), [0, 2], "the sampler's order (step 2), not the dataset's");
      const trained = new DataProto({ scores: tensor([1, 0.5, 0, 2], [2, 2]) }, { index: [0, 1] }, { global_step: 1 });
      await l.train.updateSampler(trained);
      assert.deepEqual(idx(it.next().value as DataProto), [2, 4], "update() moved the cursor to the row after index 1 (without it: 4, 1)");
      const full = l.train.stateDict();
      const state = full as typeof full & { sampler: { cursor: number; seen: unknown[] } };
      assert.deepEqual(state.sampler.seen, [{ size: 2, index: [0, 1], scores: [[1, 0.5], [0, 2]], meta: { global_step: 1 }, first: "one" }],
        "update() read the non-tensor column, the tensor and meta_info; the sampler read row 0 of verl-ts's dataset in its constructor");
      assert.equal(state.sampler.cursor, 1, "2 -> 4 -> 1");

      // a second update jumps elsewhere, and the next epoch starts from there
      await l.train.updateSampler(new DataProto({ scores: tensor([0, 0], [2, 1]) }, { index: [1, 1] }, {}));
      assert.deepEqual(idx([...l.train][0]!), [2, 4], "cursor 2 after update(index max 1)");

      const again = createRLDataloaders(d, null, { samplerClass: await loadSamplerClass(d) });
      try {
        again.train.loadStateDict({ ...state, epoch: 0, position: 2 });
        assert.deepEqual([...again.train].map(idx), [[1, 3]], "load_state_dict gave the cursor back; nothing skipped on top of it");
      } finally {
        again.close();
      }
    } finally {
      l.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("data.sampler in Python: its failures name the class and the call, with Python's traceback", { skip: noPython }, async () => {
  const dir = await workspace();
  try {
    const build = async (d: Record<string, unknown>) => createRLDataloaders(d, null, { samplerClass: await loadSamplerClass(d) });
    await assert.rejects(build(sampler(dir, "NotASampler")), /data\.sampler \(NotASampler from .*samplers\.py\): building it: it must inherit from verl\.experimental\.dataset\.sampler\.AbstractSampler/);
    await assert.rejects(build(sampler(dir, "Missing")), /samplers\.py has no class 'Missing' \(classes: .*BadIter, Curriculum, Hang, NotASampler/);
    await assert.rejects(build(sampler(dir, "Curriculum", { dataloader_num_workers: 8 })), /data\.sampler \(Curriculum from .*\): a data\.sampler needs data\.dataloader_num_workers=0, as verl requires/);
    await assert.rejects(build(data(dir, { sampler: { class_path: join(dir, "bad_import.py"), class_name: "X" } })),
      /data\.sampler \(X from .*bad_import\.py\): building it raised: ModuleNotFoundError: No module named 'numpy_that_is_not_there'\nTraceback \(most recent call last\):[\s\S]*bad_import\.py", line 1/);
    await assert.rejects(loadSamplerClass({ sampler: { class_path: join(dir, "nope.py"), class_name: "X" } }), /data\.sampler\.class_path=.*nope\.py: no such file/);

    const bad = await build(sampler(dir, "BadIter"));
    try {
      assert.throws(() => [...bad.train], /data\.sampler \(BadIter from .*\): next index \(draw 2 of the pass\) raised: ValueError: ran out of curriculum\n[\s\S]*in __iter__/);
    } finally {
      bad.close();
    }
    const t0 = Date.now();
    await assert.rejects(build(sampler(dir, "Hang", { python_timeout_s: 1 })),
      /data\.sampler \(Hang from .*\): building it ran past its 1 s timeout \(data\.python_timeout_s; the Python process was killed\)/);
    assert.ok(Date.now() - t0 < 15_000, "the hang is cut at the timeout");

    const good = sampler(dir, "Curriculum");
    const goodCls = await loadSamplerClass(good);
    assert.throws(() => withEnv({ VERL_PYTHON: "/nonexistent/python3" }, () => createRLDataloaders(good, null, { samplerClass: goodCls })),
      /data\.sampler\.class_path=.*samplers\.py is a Python class, which needs `\/nonexistent\/python3`: not found \(install Python 3, or set VERL_PYTHON/);
    assert.throws(() => withEnv({ VERL_PYTHON: "/bin/false" }, () => createRLDataloaders(good, null, { samplerClass: goodCls })),
      /VERL_PYTHON=\/bin\/false exited \(code 1\) before it started verl-ts's bridge for data\.sampler\.class_path=.*: it does not look like a working Python 3 interpreter/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("data.custom_cls in Python: without transformers in python3 the run stops saying the class needs Hugging Face's tokenizer", { skip: noPython }, async (t) => {
  const python = process.env.VERL_PYTHON || "python3";
  if (spawnSync(python, ["-c", "import transformers"]).status === 0) return void t.skip(`${python} has transformers, so the missing-transformers error cannot happen here`);
  const dir = await workspace();
  try {
    const d = data(dir, { custom_cls: { path: join(dir, "datasets.py"), name: "Rows" }, datagen: { n: 4 } });
    const cls = await loadCustomDatasetClass(d);
    assert.throws(() => createRLDataloaders(d, null, { datasetClass: cls, hfTokenizer: { path: "/models/qwen", trustRemoteCode: false } }),
      /data\.train_files: data\.custom_cls \(Rows from .*datasets\.py\): building it: verl builds dataset classes with a Hugging Face tokenizer .*cannot import transformers .*pip install transformers.*VERL_PYTHON/);
    assert.throws(() => createRLDataloaders(d, null, { datasetClass: cls }), /data\.custom_cls \(Rows from .*\): a verl dataset class is built with the model's Hugging Face tokenizer, and actor_rollout_ref\.model\.path is not set/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("data.custom_cls in Python (transformers stand-in): rows of every verl shape become verl-ts rows; a sampler gets the Python dataset itself; failures are named", { skip: noPython }, async () => {
  const dir = await workspace();
  const env = { PYTHONPATH: FAKE_TRANSFORMERS };
  try {
    const d = data(dir, { custom_cls: { path: join(dir, "datasets.py"), name: "Rows" }, datagen: { n: 4 }, val_max_samples: 2 });
    const cls = await loadCustomDatasetClass(d);
    const l = withEnv(env, () => createRLDataloaders(d, null, { datasetClass: cls, hfTokenizer: { path: "/models/tok", trustRemoteCode: false } }));
    try {
      assert.equal(l.trainDataset.length, 4, "len() of the class (data.datagen.n read from the config object)");
      assert.equal(l.valDataset.length, 2, "val_max_samples reaches the constructor as max_samples");
      const [b1, b2] = [...l.train];
      assert.deepEqual(b1!.nonTensorBatch.raw_prompt, [[{ role: "user", content: "q0 from /models/tok" }], [{ role: "user", content: "q1 from /models/tok" }]],
        "raw_prompt messages, from a class given the tokenizer of actor_rollout_ref.model.path");
      assert.deepEqual(b1!.nonTensorBatch.index, [10, 11], "index from extra_info, as RLHFDataset sets it");
      assert.deepEqual(b1!.nonTensorBatch.tools_kwargs, [{ calc: { x: 0 } }, { calc: { x: 1 } }]);
      assert.deepEqual(b1!.nonTensorBatch.reward_model, [{ ground_truth: "0", score: 0.5 }, { ground_truth: "1", score: 0.5 }]);
      assert.equal(b1!.nonTensorBatch.dummy_tensor, undefined, "verl's placeholder tensor is dropped");
      assert.deepEqual(b1!.nonTensorBatch.data_source, [join(dir, "d.parquet"), join(dir, "d.parquet")]);
      // rows with token ids only: raw_prompt_ids as they are; input_ids without the left padding
      const ids = b2!.batch.input_ids!;
      assert.deepEqual(ids.shape, [2, 16]);
      assert.deepEqual(Array.from(ids.data.slice(13, 16)), [5, 6, 7]);
      assert.deepEqual(Array.from(ids.data.slice(30, 32)), [8, 9]);
      assert.deepEqual(Array.from(b2!.batch.attention_mask!.data.slice(16, 32)), [...Array(14).fill(0), 1, 1]);
      assert.deepEqual(b2!.nonTensorBatch.index, [20, 0]);
    } finally {
      l.close();
    }

    // a Python sampler over a Python dataset: one process, the dataset object itself as data_source
    const both = { ...d, sampler: { class_path: join(dir, "sees.py"), class_name: "SeesDataset" } };
    const sees = await loadSamplerClass(both);
    const loaders = withEnv(env, () => createRLDataloaders(both, null, { datasetClass: cls, samplerClass: sees, hfTokenizer: { path: "t", trustRemoteCode: false } }));
    try {
      assert.deepEqual([...loaders.train].map((b) => b.nonTensorBatch.index), [[0, 20], [11, 10]], "rows 3, 2, 1, 0");
    } finally {
      loaders.close();
    }

    const broken = data(dir, { custom_cls: { path: join(dir, "datasets.py"), name: "Broken" }, python_timeout_s: 1 });
    const brokenCls = await loadCustomDatasetClass(broken);
    const lbad = withEnv(env, () => createRLDataloaders(broken, null, { datasetClass: brokenCls, hfTokenizer: { path: "t", trustRemoteCode: false } }));
    try {
      const ds = lbad.trainDataset;
      assert.deepEqual(ds.get(0).raw_prompt, [{ role: "user", content: "fine" }]);
      assert.throws(() => ds.get(1), /data\.custom_cls \(Broken from .*datasets\.py\): __getitem__\(1\) raised: KeyError: 'no such question'\nTraceback[\s\S]*in __getitem__/);
      assert.throws(() => ds.get(3), /data\.custom_cls \(Broken from .*\): row 3: the row carries 'multi_modal_data' \(images or videos\); verl-ts trains text models only/);
      assert.throws(() => lbad.valDataset.get(4), /data\.custom_cls\.path=.*datasets\.py: the Python process exited \(code 3\) during data\.custom_cls \(Broken from .*\): __getitem__\(4\)/);
      assert.throws(() => ds.get(0), /the Python process is gone/, "the train dataset lived in that process too");
    } finally {
      lbad.close();
    }
    const lhang = withEnv(env, () => createRLDataloaders(broken, null, { datasetClass: brokenCls, hfTokenizer: { path: "t", trustRemoteCode: false } }));
    try {
      assert.throws(() => lhang.trainDataset.get(2), /data\.custom_cls \(Broken from .*\): __getitem__\(2\) ran past its 1 s timeout \(data\.python_timeout_s; the Python process was killed\)/);
      assert.throws(() => lhang.trainDataset.get(0), /__getitem__\(0\): the Python process is gone \(.*ran past its 1 s timeout/, "no silent restart: the dataset lived in the killed process");
    } finally {
      lhang.close();
    }
    assert.throws(() => withEnv({ ...env, VERL_PYTHON: "/nonexistent" }, () => createRLDataloaders(d, null, { datasetClass: cls, hfTokenizer: { path: "t", trustRemoteCode: false } })),
      /data\.custom_cls\.path=.*datasets\.py is a Python class, which needs `\/nonexistent`: not found/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("Python data classes cost O(1) round trips a batch: rows in one get_many, indices in one next_many, results as row by row; the timeout holds per row", { skip: noPython }, async () => {
  const dir = await workspace();
  const env = { PYTHONPATH: FAKE_TRANSFORMERS };
  const hf = { path: "t", trustRemoteCode: false };
  try {
    const py = join(dir, "batched.py");
    const d = data(dir, { custom_cls: { path: py, name: "Many" }, datagen: { n: 256 }, sampler: { class_path: py, class_name: "Stride" }, train_batch_size: 32 });
    const [cls, smp] = [await loadCustomDatasetClass(d), await loadSamplerClass(d)];
    const l = withEnv(env, () => createRLDataloaders(d, null, { datasetClass: cls, samplerClass: smp, hfTokenizer: hf }));
    try {
      const ds = l.trainDataset as PythonDataset;
      const trips = l.pythonBridge!.roundTrips;
      const before = { ...trips };
      const it = l.train[Symbol.iterator]();
      const b1 = it.next().value as DataProto;
      assert.equal(b1.length, 32);
      assert.deepEqual({ calls: trips.calls - before.calls, callbacks: trips.callbacks - before.callbacks }, { calls: 3, callbacks: 0 }, "iter(), next_many(32), get_many(32)");
      const mid = trips.calls;
      const b2 = it.next().value as DataProto;
      assert.equal(trips.calls - mid, 2, "a later batch: next_many + get_many");
      const order = [...Array(64).keys()].map((k) => (7 * k) % 256);
      assert.deepEqual([...b1.nonTensorBatch.index as number[], ...b2.nonTensorBatch.index as number[]], order, "the sampler's order");
      assert.deepEqual((l.train.stateDict().sampler as { drawn: number }).drawn, 64, "no index drawn ahead of its batch (checkpointed sampler state as before)");
      // the same rows as __getitem__ one at a time: calls counts the dataset's own __getitem__ calls, in order
      const calls = (b: DataProto) => (b.nonTensorBatch.extra_info as { calls: number }[]).map((e) => e.calls);
      assert.deepEqual([...calls(b1), ...calls(b2)], [...Array(64).keys()].map((k) => k + 1));
      const one = order.slice(0, 32).map((i) => ds.get(i));
      assert.deepEqual(one.map((r) => ({ ...r, extra_info: { index: (r.extra_info as { index: number }).index } })),
        ds.getMany(order.slice(0, 32)).map((r) => ({ ...r, extra_info: { index: (r.extra_info as { index: number }).index } })), "getMany == get one by one");
      assert.deepEqual(ds.getMany([]), []);

      // before/after: 256 rows one round trip each (the old way) and in one call
      let t0 = performance.now();
      const perRow = [...Array(256).keys()].map((i) => ds.get(i));
      const perRowMs = performance.now() - t0;
      const c0 = trips.calls;
      t0 = performance.now();
      const batched = ds.getMany([...Array(256).keys()]);
      const batchedMs = performance.now() - t0;
      assert.equal(trips.calls - c0, 1);
      const strip = (r: Record<string, unknown>) => ({ ...r, extra_info: null });
      assert.deepEqual(batched.map(strip), perRow.map(strip));
      console.log(`256 Python rows: ${perRowMs.toFixed(1)} ms row by row (256 round trips), ${batchedMs.toFixed(1)} ms batched (1 round trip)`);
    } finally {
      l.close();
    }

    // a sampler over verl-ts's own rows reads them a chunk per callback
    const reads = data(dir, { sampler: { class_path: py, class_name: "ReadsAll" } });
    const lr = createRLDataloaders(reads, null, { samplerClass: await loadSamplerClass(reads) });
    try {
      assert.deepEqual(lr.pythonBridge!.roundTrips, { calls: 1, callbacks: 2 }, "building it: list(data_source) and data_source[1:3]");
    } finally {
      lr.close();
    }

    // failures inside a batch name the row; the timeout is per row, not per batch
    const failing = (datagen: Record<string, unknown>) => {
      const f = data(dir, { custom_cls: { path: py, name: "Many" }, datagen: { n: 8, ...datagen }, python_timeout_s: 1 });
      return withEnv(env, () => createRLDataloaders(f, null, { datasetClass: cls, hfTokenizer: hf }));
    };
    const slow = failing({ slow: 0.4 });
    try {
      assert.deepEqual(slow.trainDataset.getMany!([0, 1, 2, 3]).map((r) => r.index), [0, 1, 2, 3], "1.6 s for the batch, 0.4 s a row: within the 1 s timeout");
    } finally {
      slow.close();
    }
    const raising = failing({ raise_at: 6 });
    try {
      assert.throws(() => raising.trainDataset.getMany!([4, 6, 7]), /data\.custom_cls \(Many from .*batched\.py\): __getitem__\(6\) raised: IndexError: row 6 is cursed\nTraceback[\s\S]*in __getitem__/);
      assert.equal(raising.trainDataset.get(7).index, 7, "the process lives on after a Python exception");
    } finally {
      raising.close();
    }
    const notDict = failing({ raise_at: -2 });
    try {
      assert.throws(() => notDict.trainDataset.getMany!([4, 5]), /__getitem__\(5\): returned a list, not a dict/);
    } finally {
      notDict.close();
    }
    const hang = failing({ slow: 0.3, hang_at: 1 });
    try {
      const t0 = Date.now();
      assert.throws(() => hang.trainDataset.getMany!([3, 2, 1, 0]), /data\.custom_cls \(Many from .*\): __getitem__\(1\) ran past its 1 s timeout \(data\.python_timeout_s; the Python process was killed\)/);
      assert.ok(Date.now() - t0 < 15_000, "the hang is cut at the timeout");
    } finally {
      hang.close();
    }
    const exiting = failing({ exit_at: 2 });
    try {
      assert.throws(() => exiting.trainDataset.getMany!([0, 1, 2, 3]), /the Python process exited \(code 3\) during data\.custom_cls \(Many from .*\): __getitem__\(2\)$/);
    } finally {
      exiting.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("verl train with a Python curriculum sampler: the prompts follow its order and update() runs once per step with the scored batch", { skip: noPython }, async () => {
  const ws = await makeWorkspace();
  try {
    const log = join(ws.dir, "updates.jsonl");
    writeFileSync(join(ws.dir, "curriculum.py"), `
import json
from verl import DataProto
from verl.experimental.dataset.sampler import AbstractCurriculumSampler


class Reverse(AbstractCurriculumSampler):
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.openings = [data_source[i]["prompt"][0]["content"] for i in range(self.n)]

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def update(self, batch: DataProto) -> None:
        scores = batch.batch["token_level_scores"]
        with open(${JSON.stringify(log)}, "a") as f:
            f.write(json.dumps({
                "rows": len(batch),
                "scored": len(scores) == len(batch),
                "adv": "advantages" in batch.batch,
                "index": sorted(set(int(i) for i in batch.non_tensor_batch["index"])),
                "last_opening": self.openings[-1],
            }) + "\\n")
`);
    const run = await runTrain([...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2",
      `data.sampler.class_path=${join(ws.dir, "curriculum.py")}`, "data.sampler.class_name=Reverse", "data.dataloader_num_workers=0",
      `trainer.rollout_data_dir=${ws.dir}/d`, `trainer.default_local_dir=${ws.dir}/c`], {});
    assert.equal(run.code, 0, run.stderr);
    const updates = readFileSync(log, "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.deepEqual(updates, [
      { rows: 8, scored: true, adv: true, index: [4, 5, 6, 7], last_opening: "Ben and Mia went to" },
      { rows: 8, scored: true, adv: true, index: [0, 1, 2, 3], last_opening: "Ben and Mia went to" },
    ], "one update per step, with the batch of the prompts the sampler chose (batch 4 x n 2)");
    const step1 = readFileSync(join(ws.dir, "d/1.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { input: string });
    assert.match(step1[0]!.input, /Ben and Mia went to/, "row 7 first");
    assert.match(step1[2]!.input, /The sun was hot/, "then row 6");
    const step2 = readFileSync(join(ws.dir, "d/2.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { input: string });
    assert.match(step2[0]!.input, /The cat saw a/, "step 2 continues: row 3");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("verl train with a Python dataset class and a Python sampler over it (transformers stand-in): the run's prompts come from the class", { skip: noPython }, async () => {
  const ws = await makeWorkspace();
  try {
    writeFileSync(join(ws.dir, "stories.py"), `
from verl.experimental.dataset.sampler import AbstractSampler

try:
    from torch.utils.data import Dataset
except ImportError:
    Dataset = object


class Stories(Dataset):
    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        self.model = tokenizer.name_or_path
        self.words = ["Zed saw", "Ann met", "Bo ran", "Cy sat"] if "train" in data_files[0] else ["Val one", "Val two"]

    def __len__(self):
        return len(self.words)

    def __getitem__(self, i):
        return {"raw_prompt": [{"role": "user", "content": self.words[i]}], "data_source": "stories",
                "reward_model": {"style": "rule", "ground_truth": "e"}, "extra_info": {"index": i, "model": self.model}}


class Backwards(AbstractSampler):
    def __init__(self, data_source, data_config):
        assert isinstance(data_source, Stories), type(data_source)
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))
`);
    const py = join(ws.dir, "stories.py");
    const run = await runTrain([...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
      `data.custom_cls.path=${py}`, "data.custom_cls.name=Stories", `data.sampler.class_path=${py}`, "data.sampler.class_name=Backwards", "data.dataloader_num_workers=0",
      `trainer.rollout_data_dir=${ws.dir}/d`, `trainer.default_local_dir=${ws.dir}/c`], { PYTHONPATH: FAKE_TRANSFORMERS });
    assert.equal(run.code, 0, run.stderr);
    const step1 = readFileSync(join(ws.dir, "d/1.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { input: string });
    assert.deepEqual(step1.map((r) => r.input.match(/(Cy sat|Bo ran|Ann met|Zed saw)/)?.[1]), ["Cy sat", "Cy sat", "Bo ran", "Bo ran", "Ann met", "Ann met", "Zed saw", "Zed saw"],
      "the class's prompts, in the sampler's order, n=2 each");
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

// Needs a python3 with transformers (torch optional): VERL_PYTHON=/path/to/python3 node scripts/run-tests.mjs python_data
test("data.custom_cls in Python with Hugging Face's tokenizer (VERL_PYTHON with transformers): the class tokenizes with the model's tokenizer, verl-ts uses its ids", async (t) => {
  const python = process.env.VERL_PYTHON;
  if (!python) return void t.skip("set VERL_PYTHON to a python3 that has transformers to run this test");
  if (spawnSync(python, ["-c", "import transformers"]).status !== 0) return void t.skip(`VERL_PYTHON=${python} cannot import transformers`);
  const dir = await workspace();
  try {
    writeFileSync(join(dir, "tok_dataset.py"), `
import transformers
try:
    from torch.utils.data import Dataset
except ImportError:
    Dataset = object


class Tokenized(Dataset):
    """Older verl's shape: the prompt tokenized by the dataset, no raw_prompt."""

    def __init__(self, data_files, tokenizer, processor, config, max_samples=-1):
        assert isinstance(tokenizer, transformers.PreTrainedTokenizerBase), type(tokenizer)
        self.tokenizer = tokenizer
        self.texts = ["hello world", "the cat sat on the mat", "one two three", "four"]

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        ids = self.tokenizer(self.texts[i], add_special_tokens=False, return_tensors=None)["input_ids"]
        return {"raw_prompt_ids": ids, "data_source": "tok", "extra_info": {"index": i, "pad": self.tokenizer.pad_token}}
`);
    const d = data(dir, { custom_cls: { path: join(dir, "tok_dataset.py"), name: "Tokenized" }, max_prompt_length: 32 });
    const l = createRLDataloaders(d, null, { datasetClass: await loadCustomDatasetClass(d), hfTokenizer: { path: QWEN_FIXTURE, trustRemoteCode: false } });
    try {
      const ours = await loadTokenizer(QWEN_FIXTURE);
      const rows = [0, 1, 2, 3].map((i) => l.trainDataset.get(i));
      rows.forEach((r, i) => assert.deepEqual(r.input_ids, ours.encode(["hello world", "the cat sat on the mat", "one two three", "four"][i]!, { addSpecialTokens: false }), `row ${i}`));
      assert.equal((rows[0]!.extra_info as { pad: string }).pad, "<|endoftext|>");
      assert.equal([...l.train].length, 2);
    } finally {
      l.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
