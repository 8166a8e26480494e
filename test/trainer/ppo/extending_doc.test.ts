// Runs the example module of docs/extending.md, so the documented extension path
// (register in a module, select by name) keeps working.
import { before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import * as tf from "@tensorflow/tfjs";
import { packageRoot } from "../../../src/utils/paths.js";
import { computeAdvantage, getPolicyLoss, keepMetrics, readMetrics } from "../../../src/trainer/ppo/core_algos/index.js";
import type { LossMetrics } from "../../../src/trainer/ppo/core_algos/index.js";
import { DataProto, tensor } from "../../../src/protocol/index.js";
import { close, closeAll, cpu, finiteDiff, t2, type Mat } from "./helpers.js";

before(async () => {
  await cpu();
  const doc = readFileSync(join(packageRoot, "docs", "extending.md"), "utf8");
  const block = /```js\n(\/\/ my_algos\.mjs\n[\s\S]*?)```/.exec(doc)?.[1];
  assert.ok(block, "docs/extending.md has a ```js block starting with // my_algos.mjs");
  // Point the package imports at this build: "verl-ts" → the algorithms index.
  const coreAlgos = new URL("../../../src/trainer/ppo/core_algos/index.js", import.meta.url).href;
  const source = block
    .replace(/from "verl-ts"/g, `from "${coreAlgos}"`)
    .replace(/from "@tensorflow\/tfjs"/g, `from "${import.meta.resolve("@tensorflow/tfjs")}"`);
  const file = join(mkdtempSync(join(tmpdir(), "verl-ext-")), "my_algos.mjs");
  writeFileSync(file, source);
  await import(pathToFileURL(file).href);
});

test("the documented estimator runs through computeAdvantage by name", async () => {
  const data = DataProto.fromDict(
    { token_level_rewards: tensor([0, 1, 0, 0, 0, 3, 0, 2], [4, 2]), response_mask: tensor(new Int32Array([1, 1, 1, 1, 1, 0, 1, 1]), [4, 2]) },
    { uid: ["p", "p", "p", "q"] },
  );
  await computeAdvantage(data, { advEstimator: "grpo_median" });
  // p: scores 1, 0, 3 → median 1; q: a single score, its own median.
  closeAll(Array.from(data.batch.advantages!.data), [0, 0, -1, -1, 2, 0, 0, 0], 1e-6);
});

test("the documented loss: value, metrics and gradient", async () => {
  const old: Mat = [[-1, -2, -0.5], [-1.2, -0.7, -3]];
  const lp: Mat = [[-0.8, -2.4, -0.5], [-1.0, -0.7, -2.9]];
  const adv: Mat = [[1, 1, 1], [-0.5, -0.5, -0.5]];
  const mask: Mat = [[1, 1, 0], [1, 1, 1]];
  const config = { clip_ratio: 0.2, policy_loss: { kl_beta: 0.05 } };
  const reference = (x: Mat) => {
    let s = 0;
    x.forEach((row, i) => row.forEach((l, t) => {
      const d = l - old[i]![t]!, r = Math.exp(d), a = adv[i]![t]!;
      s += mask[i]![t]! * (Math.max(-a * r, -a * Math.min(Math.max(r, 0.8), 1.2)) + 0.025 * d * d);
    }));
    return s / 5;
  };
  const v = tf.variable(t2(lp));
  let kept: LossMetrics = {};
  const { value, grads } = tf.variableGrads(() => {
    const out = getPolicyLoss("ppo_sq_kl")({ oldLogProb: t2(old), logProb: v, advantages: t2(adv), responseMask: t2(mask), config });
    kept = keepMetrics(out.metrics);
    return out.pgLoss;
  }, [v]);
  close(value.dataSync()[0]!, reference(lp), 1e-5);
  closeAll(Array.from(Object.values(grads)[0]!.dataSync()), finiteDiff(reference, lp, 1e-6).flat(), 1e-4);
  const metrics = await readMetrics(kept);
  assert.deepEqual(Object.keys(metrics).sort(), ["actor/ppo_kl", "actor/sq_kl_penalty"]);
  close(metrics["actor/ppo_kl"]!, (-0.2 + 0.4 - 0.2 - 0 - 0.1) / 5, 1e-5);
});
