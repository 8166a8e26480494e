// The MTP loss of model.mtp.enable_train on a tiny MiMo: which positions it reads (response
// token j from the trunk's state two columns back and the token one column back, padded and
// packed alike), its gradient (finite differences), and detach_encoder (the trunk's gradient
// is the one without MTP).
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import type { DataProto } from "../../src/protocol/index.js";
import { defaultSamplingParams, generate, leftPadPrompts, responseLogProbs } from "../../src/rollout/index.js";
import { mtpTokenMask } from "../../src/rollout/log_probs.js";
import { aggLoss } from "../../src/trainer/ppo/core_algos/index.js";
import { Rng } from "../../src/utils/rng.js";
import { maxDiff } from "../models/families_fixtures.js";
import { writeTinyMimo } from "../models/mimo_fixture.js";

async function withMimo(fn: (m: LlamaModel, micro: DataProto) => Promise<void>): Promise<void> {
  await initBackend("cpu");
  const dir = mkdtempSync(join(tmpdir(), "mimo-"));
  try {
    const m = await loadHfModel(writeTinyMimo(dir));
    try {
      // the one-token prompt's first response token has no MTP position (nothing two columns back)
      const batch = leftPadPrompts([[1, 2, 3, 4], [5, 6], [7]], 0, 6);
      const out = generate(m, batch, defaultSamplingParams({ temperature: 1, responseLength: 6, eosTokenIds: [9], padTokenId: 0 }), new Rng(2));
      await fn(m, out.select(["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]));
    } finally {
      m.dispose();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The MTP loss: token mean of the MTP head's cross entropy over mtpTokenMask. */
function mtpLoss(m: LlamaModel, micro: DataProto, detachEncoder = false): tf.Scalar {
  const r = responseLogProbs(m, micro, { mtp: { detachEncoder } });
  return aggLoss(tf.neg(r.mtp!.logProbs), r.mtp!.mask, "token-mean");
}

test("MTP log-probs: response j from the state at P+j-2 and token P+j-1; padded equals packed; the mask", async () => {
  await withMimo(async (m, micro) => {
    const ids = micro.batch["input_ids"]!, mask = micro.batch["attention_mask"]!, resp = micro.batch["responses"]!;
    const [B, L] = ids.shape as [number, number], R = resp.shape[1]!, P = L - R;
    const padded = responseLogProbs(m, micro, { mtp: {} }).mtp!, packed = responseLogProbs(m, micro, { mtp: {}, removePadding: true }).mtp!;
    const [lp, msk, lpPacked, mskPacked] = [padded.logProbs, padded.mask, packed.logProbs, packed.mask].map((t) => t.dataSync());
    assert.deepEqual(msk, mtpTokenMask(micro).data);
    assert.deepEqual(mskPacked, msk);
    assert.ok(maxDiff(lpPacked!, lp!) < 1e-4, `packed differs by ${maxDiff(lpPacked!, lp!)}`);
    // each row alone, unpadded: the MTP logits at t predict token t+2
    let covered = 0;
    for (let b = 0; b < B; b++) {
      const real: number[] = [];
      let firstReal = -1;
      for (let t = 0; t < L; t++) if (mask.data[b * L + t]) { if (firstReal < 0) firstReal = t; real.push(Number(ids.data[b * L + t])); }
      const { logits, mtpLogits } = m.forwardWithMtp(tf.tensor2d([real], [1, real.length], "int32"));
      const lsm = tf.logSoftmax(mtpLogits).arraySync()[0]!;
      tf.dispose([logits, mtpLogits]);
      for (let j = 0; j < R; j++) {
        const t = P + j - 2 - firstReal; // the row's own index of column P+j-2
        if (!mask.data[b * L + P + j] || t < 0) { assert.equal(msk![b * R + j], 0, `row ${b} slot ${j} masked`); continue; }
        assert.equal(msk![b * R + j], 1);
        const want = lsm[t]![Number(resp.data[b * R + j])]!;
        assert.ok(Math.abs(lp![b * R + j]! - want) < 1e-4, `row ${b} slot ${j}: ${lp![b * R + j]} vs ${want}`);
        covered++;
      }
    }
    assert.ok(covered >= 6, `${covered} MTP tokens checked`);
    assert.equal(msk![2 * R], 0, "the one-token prompt's first response token has no MTP position");
  });
});

test("MTP loss gradient matches finite differences (MTP layer, trunk, embedding, shared lm_head)", async () => {
  await withMimo(async (m, micro) => {
    const probes: [string, number][] = [
      ["model.mtp_layers.0.input_proj.weight", 37], ["model.mtp_layers.0.token_layernorm.weight", 2], ["model.mtp_layers.0.self_attn.v_proj.bias", 5],
      ["model.layers.0.self_attn.q_proj.weight", 70], ["model.layers.1.mlp.down_proj.weight", 11],
      ["model.embed_tokens.weight", 7 * 32 + 3], ["lm_head.weight", Number(micro.batch["responses"]!.data[1]) * 32 + 4],
    ];
    const { value, grads } = tf.variableGrads(() => mtpLoss(m, micro), m.trainableVariables());
    value.dispose();
    const byName = new Map([...m.params].map(([n, v]) => [v.name, n]));
    const g = new Map(Object.entries(grads).map(([k, t]) => [byName.get(k)!, t.dataSync()]));
    tf.dispose(Object.values(grads));
    const f = () => tf.tidy(() => mtpLoss(m, micro).dataSync()[0]!);
    const eps = 1e-2;
    for (const [name, i] of probes) {
      const v = m.params.get(name)!, orig = v.dataSync().slice();
      const at = (d: number) => { const a = orig.slice(); a[i] += d; v.assign(tf.tensor(a, v.shape)); return f(); };
      const fd = (at(eps) - at(-eps)) / (2 * eps);
      v.assign(tf.tensor(orig, v.shape));
      const an = g.get(name)![i]!;
      assert.ok(Math.abs(an) > 1e-4, `${name}[${i}]: the probe has a gradient (${an})`);
      assert.ok(Math.abs(fd - an) < 2e-3 + 0.02 * Math.abs(an), `${name}[${i}]: analytic ${an}, finite differences ${fd}`);
    }
  });
});

test("detach_encoder: the trunk's and the embedding's gradient equal the no-MTP one; without it they differ", async () => {
  await withMimo(async (m, micro) => {
    const R = micro.batch["responses"]!.shape[1]!, B = micro.length;
    const rmask = tf.tensor2d(Float32Array.from(micro.batch["response_mask"]!.data as ArrayLike<number>), [B, R]);
    const main = () => tf.neg(tf.sum(tf.mul(responseLogProbs(m, micro).logProbs, rmask))) as tf.Scalar;
    const withMtp = (detach: boolean) => () => {
      const r = responseLogProbs(m, micro, { mtp: { detachEncoder: detach } });
      const l = tf.neg(tf.sum(tf.mul(r.logProbs, rmask)));
      return tf.add(l, tf.mul(aggLoss(tf.neg(r.mtp!.logProbs), r.mtp!.mask, "token-mean"), 0.1)) as tf.Scalar;
    };
    const byName = new Map([...m.params].map(([n, v]) => [v.name, n]));
    const gradsOf = (fn: () => tf.Scalar) => {
      const { value, grads } = tf.variableGrads(fn, m.trainableVariables());
      value.dispose();
      const out = new Map(Object.entries(grads).map(([k, t]) => [byName.get(k)!, t.dataSync()]));
      tf.dispose(Object.values(grads));
      return out;
    };
    const base = gradsOf(main), detached = gradsOf(withMtp(true)), joint = gradsOf(withMtp(false));
    const trunk = [...m.params.keys()].filter((n) => !n.startsWith("model.mtp_layers.") && n !== "lm_head.weight");
    for (const n of trunk) assert.ok(maxDiff(detached.get(n)!, base.get(n)!) === 0, `${n}: detached gradient differs by ${maxDiff(detached.get(n)!, base.get(n)!)}`);
    // the MTP layer trains, and so does the shared head (Megatron detaches only the MTP layer's inputs)
    for (const n of ["model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.mlp.up_proj.weight"]) assert.ok(detached.get(n)!.some((x) => x !== 0), `${n} has a gradient`);
    assert.ok(maxDiff(detached.get("lm_head.weight")!, base.get("lm_head.weight")!) > 0);
    // without detach_encoder the MTP loss reaches the trunk and the embedding
    for (const n of ["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"]) assert.ok(maxDiff(joint.get(n)!, base.get(n)!) > 1e-6, `${n}: the joint gradient differs`);
  });
});

test("the actor's MTP loss is Megatron's: each micro-batch's own token mean, averaged over the micro-batches", async () => {
  const { loadConfig } = await import("../../src/config/index.js");
  const { ConfigView } = await import("../../src/workers/config_view.js");
  const { DataParallelOptimizer } = await import("../../src/workers/dp_optimizer.js");
  const { DataParallelPPOActor } = await import("../../src/workers/actor/dp_actor.js");
  const { Collective } = await import("../../src/single_controller/collective.js");
  const { tensor } = await import("../../src/protocol/tensor.js");
  await withMimo(async (m, batch) => {
    // rows of different MTP token counts (4-token, 2-token and 1-token prompts), one row a micro-batch
    const counts = [0, 1, 2].map((b) => { const s = batch.slice(b, b + 1); let n = 0; for (const v of mtpTokenMask(s).data) n += v; return n; });
    assert.ok(new Set(counts).size > 1, `MTP token counts ${counts} must differ for the test to tell the averages apart`);
    const perRow = [0, 1, 2].map((b) => tf.tidy(() => mtpLoss(m, batch.slice(b, b + 1)).dataSync()[0]!));
    const data = batch.clone();
    const [B, R] = data.batch["responses"]!.shape as [number, number];
    data.batch["advantages"] = tensor(new Float32Array(B * R), [B, R], "float32");
    data.batch["old_log_probs"] = tensor(new Float32Array(B * R), [B, R], "float32");
    data.metaInfo.temperature = 1.0;
    const cfg = loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.actor.optim.lr=0.0", "actor_rollout_ref.actor.use_kl_loss=false"] });
    const view = new ConfigView(cfg, "actor_rollout_ref.actor");
    const opt = new DataParallelOptimizer(m.trainableVariables(), view.at("optim"), 10, Collective.single(), 1.0);
    const actor = new DataParallelPPOActor(m, opt, { config: view, miniBatchPerRank: 3, microBatchPerRank: 1, seed: 1, mtpTrain: { scale: 0.1, detachEncoder: false } });
    const metrics = await actor.updatePolicy(data);
    const got = metrics["actor/mtp_losses/mtp_1_loss"]![0]!;
    const microMean = perRow.reduce((a, x) => a + x, 0) / 3;
    const tokenMean = perRow.reduce((a, x, i) => a + x * counts[i]!, 0) / counts.reduce((a, x) => a + x, 0);
    assert.ok(Math.abs(got - microMean) < 1e-4, `mtp loss ${got}: micro-batch mean ${microMean}, token mean over the mini-batch ${tokenMean}`);
    assert.ok(Math.abs(microMean - tokenMean) > 1e-3, "the two averages differ on these rows");
    opt.dispose();
  });
});
