// MoE routing replay (verl's router_replay R2/R3, rollout.enable_rollout_routing_replay) on the
// committed qwen3_moe fixture (3 layers, layer 1 dense: 2 sparse layers, 4 experts, top-2):
// replaying a pass's own experts reproduces it bit for bit, other experts change it, the router
// still gets its gradient, the host decoder records what the training forward chooses, and the
// trainer runs R2 and R3 end to end (a dense model is refused naming the key).
import { test } from "node:test";
import assert from "node:assert/strict";
import { cpSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { loadHfModel } from "../../src/models/hf.js";
import type { LlamaModel } from "../../src/models/llama.js";
import { defaultSamplingParams, generate, leftPadPrompts, responseLogProbs } from "../../src/rollout/index.js";
import { tensor, type TensorData } from "../../src/protocol/tensor.js";
import type { DataProto } from "../../src/protocol/index.js";
import { Rng } from "../../src/utils/rng.js";
import { loadConfig } from "../../src/config/index.js";
import { runPpo } from "../../src/trainer/main_ppo.js";
import { makeWorkspace } from "../trainer/ppo/trainer/fixtures.js";
import { fixtureDir, maxDiff } from "./families_fixtures.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";

const S = 2, K = 2, E = 4; // the fixture's sparse layers, top-k, experts

/** A left-padded rollout of the fixture's model (5 prompts of different lengths, 12 tokens each). */
function rollout(model: LlamaModel, recordRouting = false, n = 1): DataProto {
  const prompts = leftPadPrompts([[5, 17, 33, 2, 9, 40], [7, 8], [100, 101, 102, 103], [250], [11, 12, 13]], 0);
  const params = defaultSamplingParams({ temperature: 1, responseLength: 12, eosTokenIds: [3], padTokenId: 0, calculateLogProbs: true, n });
  return generate(model, prompts, params, new Rng(7), { recordRouting });
}

function logProbs(model: LlamaModel, data: DataProto, opts: { replay?: TensorData; removePadding?: boolean } = {}): { lp: Float32Array; routed: TensorData } {
  const r = responseLogProbs(model, data, { recordExperts: true, removePadding: opts.removePadding, ...(opts.replay ? { replayExperts: opts.replay } : {}) });
  const out = { lp: r.logProbs.dataSync() as Float32Array, routed: tensor(r.routedExperts!.dataSync() as Int32Array, r.routedExperts!.shape, "int32") };
  tf.dispose([r.logProbs, r.routedExperts!]);
  return out;
}

/** Runs `fn` on the qwen3_moe fixture's model, disposed after. */
async function withMoe(fn: (model: LlamaModel) => void | Promise<void>): Promise<void> {
  await initBackend("wasm");
  const model = await loadHfModel(fixtureDir("qwen3_moe"));
  try {
    await fn(model);
  } finally {
    model.dispose();
  }
}

/** Every token's experts moved to the next ones (mod E): a different, still valid routing. */
function shifted(t: TensorData): TensorData {
  return tensor(Int32Array.from(t.data, (e) => (e + 1) % E), t.shape, "int32");
}

test("qwen3_moe: replaying a pass's own experts reproduces its logits and log-probs exactly; other experts change them", () => withMoe(async (model) => {
  // the model forward: record per sparse layer, replay as [N, S, K]
  const ids = [5, 17, 33, 2, 9, 40, 77, 120], N = ids.length;
  const chosen: tf.Tensor[] = [];
  const free = tf.tidy(() => model.forward(tf.tensor2d(ids, [1, N], "int32"), { routedExperts: chosen }).dataSync() as Float32Array);
  assert.equal(chosen.length, S, "one record per sparse layer (the dense layer 1 has none)");
  const perLayer = chosen.map((t) => t.dataSync() as Int32Array);
  tf.dispose(chosen);
  const replay = new Int32Array(N * S * K);
  for (let n = 0; n < N; n++) for (let j = 0; j < S; j++) for (let k = 0; k < K; k++) replay[(n * S + j) * K + k] = perLayer[j]![n * K + k]!;
  const again = tf.tidy(() => model.forward(tf.tensor2d(ids, [1, N], "int32"), { replayExperts: replay }).dataSync() as Float32Array);
  assert.equal(maxDiff(free, again), 0, "own routing replayed: identical logits");
  const other = tf.tidy(() => model.forward(tf.tensor2d(ids, [1, N], "int32"), { replayExperts: Int32Array.from(replay, (e) => (e + 1) % E) }).dataSync() as Float32Array);
  assert.ok(maxDiff(free, other) > 1e-3, `other experts change the logits (by ${maxDiff(free, other)})`);
  assert.throws(() => model.forward(tf.tensor2d(ids, [1, N], "int32"), { replayExperts: replay.subarray(1) }), /replayExperts holds 31 values, 8 tokens x 2 sparse layers x top-2 need 32/);
  assert.throws(() => model.forward(tf.tensor2d(ids, [1, N], "int32"), { replayExperts: Int32Array.from(replay, () => E) }), /expert 4, outside \[0, 4\)/);

  // the log-prob pass over a left-padded rollout batch (trimmed columns), padded and packed
  const data = rollout(model);
  const mask = data.batch.response_mask!.data;
  for (const removePadding of [false, true]) {
    const first = logProbs(model, data, { removePadding });
    assert.deepEqual(first.routed.shape, [5, data.batch.input_ids!.shape[1], S, K]);
    const replayed = logProbs(model, data, { replay: first.routed, removePadding });
    assert.equal(maxDiff(first.lp, replayed.lp), 0, `removePadding=${removePadding}: replaying the pass's own routing gives the same log-probs`);
    assert.deepEqual(replayed.routed.data, first.routed.data, "and records the routing it replayed");
    const moved = logProbs(model, data, { replay: shifted(first.routed), removePadding });
    let changed = 0;
    for (let i = 0; i < mask.length; i++) if (mask[i] && Math.abs(moved.lp[i]! - first.lp[i]!) > 1e-4) changed++;
    assert.ok(changed > Array.from(mask).reduce((a, v) => a + v, 0) / 2, `removePadding=${removePadding}: other experts change most log-probs (${changed})`);
  }
  // padded and packed forwards choose the same experts on every real token (the padded one stops
  // before the batch's last real column, which predicts nothing: it records 0 there)
  const a = logProbs(model, data).routed.data, b = logProbs(model, data, { removePadding: true }).routed.data;
  const attn = data.batch.attention_mask!.data, L = data.batch.input_ids!.shape[1]!;
  let lastCol = 0;
  for (let i = 0; i < attn.length; i++) if (attn[i]) lastCol = Math.max(lastCol, i % L);
  for (let i = 0; i < attn.length; i++) {
    if (!attn[i]) continue;
    const want = i % L === lastCol ? new Int32Array(S * K) : b.subarray(i * S * K, (i + 1) * S * K);
    assert.deepEqual(a.subarray(i * S * K, (i + 1) * S * K), want, `token ${i}`);
  }
}));

test("qwen3_moe: under replay the router still gets its gradient (the gate weights are recomputed), the same one as without replay", () => withMoe(async (model) => {
  const data = rollout(model);
  const { routed } = logProbs(model, data);
  const [B, R] = data.batch.responses!.shape as [number, number];
  const weight = tf.tensor2d(Float32Array.from(data.batch.response_mask!.data), [B, R]);
  const gateGrads = (replay?: TensorData) => {
    const { value, grads } = tf.variableGrads(() => {
      const r = responseLogProbs(model, data, replay ? { replayExperts: replay } : {});
      return tf.mul(r.logProbs, weight).sum().neg() as tf.Scalar;
    }, model.trainableVariables());
    const out = [0, 2].map((layer) => grads[model.p(`model.layers.${layer}.mlp.gate.weight`).name]!.dataSync() as Float32Array);
    tf.dispose([value, ...Object.values(grads)]);
    return out;
  };
  const free = gateGrads(), own = gateGrads(routed), other = gateGrads(shifted(routed));
  for (const [j, g] of own.entries()) {
    assert.ok(g.some((v) => Math.abs(v) > 1e-6), `sparse layer ${j}: the router's weights get a gradient under replay`);
    assert.ok(maxDiff(g, free[j]!) < 1e-6, `sparse layer ${j}: replaying the own routing gives the free pass's gradient (${maxDiff(g, free[j]!)})`);
    assert.ok(maxDiff(other[j]!, free[j]!) > 1e-6, `sparse layer ${j}: a different routing gives a different gradient`);
  }
  weight.dispose();
}));

test("qwen3_moe: the host decoder records the experts the training forward chooses, and replaying them gives the rollout's log-probs (rollout.n siblings sharing a prefill too)", () => withMoe(async (model) => {
  for (const n of [1, 2]) {
  const data = rollout(model, true, n);
  const rec = data.batch.routed_experts!;
  const [B, L] = data.batch.input_ids!.shape as [number, number], R = 12, P = L - R;
  assert.deepEqual(rec.shape, [B, L, S, K]);
  assert.equal(rec.dtype, "int32");
  // the same prompts and samples without recording: recording changes nothing
  const plain = rollout(model, false, n);
  assert.deepEqual(plain.batch.responses!.data, data.batch.responses!.data);
  const train = logProbs(model, data).routed.data;
  const attn = data.batch.attention_mask!.data, rmask = data.batch.response_mask!.data;
  let compared = 0;
  for (let b = 0; b < B; b++) {
    let last = P - 1; // the last real token is never fed back, so it has no recorded routing
    for (let t = 0; t < R; t++) if (rmask[b * R + t]) last = P + t;
    for (let s = 0; s < L; s++) {
      const at = (b * L + s) * S * K, got = rec.data.subarray(at, at + S * K);
      if (!attn[b * L + s] || s === last) { assert.ok(got.every((e) => e === 0), `row ${b} column ${s}: nothing recorded`); continue; }
      assert.deepEqual(got, train.subarray(at, at + S * K), `n=${n} row ${b} column ${s}: decoder and training forward route alike`);
      compared++;
    }
  }
  assert.ok(compared > 30, `${compared} tokens compared`);
  const replayed = logProbs(model, data, { replay: rec });
  const rollLp = data.batch.rollout_log_probs!.data;
  for (let i = 0; i < B * R; i++) if (rmask[i]) assert.ok(Math.abs(replayed.lp[i]! - rollLp[i]!) < 1e-4, `n=${n} slot ${i}: ${replayed.lp[i]} vs rollout ${rollLp[i]}`);
  }
  // a dense model has nothing to record
  const dense = await loadHfModel(fixtureDir("qwen3"));
  try {
    assert.throws(() => rollout(dense, true), /recordRouting: the model has no routed experts/);
  } finally {
    dense.dispose();
  }
}));

test("qwen3_moe: the batching server (agent loops) records each request's routing, a second turn's reused prefix included", () => withMoe(async (model) => {
  const server = new ContinuousBatchingServer(model, { maxNumSeqs: 2, maxModelLen: 64, eosTokenIds: [3], rng: new Rng(1), recordRouting: true });
  const greedy = { temperature: 0, topP: 1, topK: -1, maxTokens: 6 };
  const first = [5, 17, 33, 2, 9, 40];
  const [a, other] = await Promise.all([server.generate("a", first, greedy), server.generate("b", [7, 8, 9], greedy)]);
  const second = [...first, ...a.tokenIds, 250, 11]; // the next turn: the conversation so far plus a user turn
  const b = await server.generate("a2", second, greedy);
  assert.ok(server.stats().reusedTokens > 0, "the second turn reused the first one's cache");
  for (const [prompt, out] of [[first, a], [[7, 8, 9], other], [second, b]] as const) {
    const ids = [...prompt, ...out.tokenIds], n = ids.length;
    assert.deepEqual(out.routedExperts!.shape, [n, S, K]);
    const chosen: tf.Tensor[] = [];
    tf.tidy(() => { model.forward(tf.tensor2d(ids, [1, n], "int32"), { routedExperts: chosen }); });
    const perLayer = chosen.map((t) => t.dataSync() as Int32Array);
    tf.dispose(chosen);
    for (let t = 0; t < n; t++) {
      const want = t === n - 1 ? [0, 0, 0, 0] : perLayer.flatMap((l) => [...l.subarray(t * K, (t + 1) * K)]);
      assert.deepEqual([...out.routedExperts!.data.subarray(t * S * K, (t + 1) * S * K)], want, `token ${t} of ${n}`);
    }
  }
  await server.sleep();
}));

/** `verl train` for 2 GRPO steps on a copy of a family fixture with the given overrides. */
async function train(family: string, extra: string[]): Promise<Record<string, number>[]> {
  const ws = await makeWorkspace();
  try {
    const model = join(ws.dir, family);
    cpSync(fixtureDir(family), model, { recursive: true });
    writeFileSync(join(model, "chat_template.jinja"), "{% for m in messages %}{{ m['content'] }}{% endfor %}");
    const overrides = [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo",
      "data.max_prompt_length=24", "trainer.total_training_steps=2", "trainer.logger=[]", "trainer.save_freq=-1",
      `trainer.default_local_dir=${join(ws.dir, "ckpt")}`, ...extra];
    const res = await runPpo(loadConfig({ configName: "ppo_trainer", overrides }));
    return res.history.map((h) => h.metrics);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
}

const MODE = "actor_rollout_ref.actor.router_replay.mode", ROLLOUT = "actor_rollout_ref.rollout.enable_rollout_routing_replay";

for (const [name, extra] of [
  ["R2", [`${MODE}=R2`]],
  // gradient checkpointing: a recomputed layer replays the same experts
  ["R3, gradient checkpointing", [`${MODE}=R3`, `${ROLLOUT}=True`, "actor_rollout_ref.model.enable_gradient_checkpointing=true"]],
  ["R3, agent-loop rollout", [`${MODE}=R3`, `${ROLLOUT}=True`, "actor_rollout_ref.rollout.multi_turn.enable=true"]],
  // routed_experts split over ranks, balanced, reordered by token-budget micro-batches and packed rows
  ["R2 and R3's record, 2 ranks, packed rows, dynamic batch sizes", [`${MODE}=R2`, `${ROLLOUT}=True`, "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40"]],
] as const) {
  test(`qwen3_moe: 2 GRPO steps with router replay ${name}`, async () => {
    await initBackend("wasm");
    const steps = await train("qwen3_moe", [...extra, "actor_rollout_ref.actor.ppo_mini_batch_size=2"]);
    assert.equal(steps.length, 2);
    for (const [i, m] of steps.entries()) {
      for (const k of ["actor/pg_loss", "actor/grad_norm", "actor/router_aux_loss", "actor/entropy"]) assert.ok(Number.isFinite(m[k]), `${name} step ${i + 1}: ${k} = ${m[k]}`);
      assert.ok(m["actor/grad_norm"]! > 0, `${name} step ${i + 1}: a gradient flows`);
    }
  });
}

test("qwen3_moe: R2 replays live: on one mini-batch the update matches a run without replay exactly; after the first of two mini-batch steps it does not", async () => {
  await initBackend("wasm");
  const keys = ["actor/pg_loss", "actor/grad_norm", "actor/router_aux_loss"];
  const pick = (steps: Record<string, number>[]) => steps.map((m) => keys.map((k) => m[k]));
  // one mini-batch: the update's weights are those the old-log-prob pass routed with, so its own routing is the free one
  const one = ["actor_rollout_ref.actor.ppo_mini_batch_size=4"];
  assert.deepEqual(pick(await train("qwen3_moe", [...one, `${MODE}=R2`])), pick(await train("qwen3_moe", one)));
  // two mini-batches and a large step: the second replays routing the moved router would no longer choose
  const two = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=0.05"];
  const [withReplay, without] = [await train("qwen3_moe", [...two, `${MODE}=R2`]), await train("qwen3_moe", two)];
  assert.notDeepEqual(pick(withReplay), pick(without));
});

test("router replay: refused with the key named on a dense model, without the rollout's record (R3), on an engine that cannot record", async () => {
  await initBackend("wasm");
  await assert.rejects(train("qwen3", [`${MODE}=R2`]), /router_replay\.mode=R2: the model has no routed experts \(model_type qwen3\); router replay needs a MoE model/);
  await assert.rejects(train("qwen3", [`${ROLLOUT}=True`]), /enable_rollout_routing_replay=True: the model has no routed experts/);
  await assert.rejects(train("qwen3_moe", [`${MODE}=R3`]), /router_replay\.mode=R3 replays the rollout's routing: set actor_rollout_ref\.rollout\.enable_rollout_routing_replay=True/);
  await assert.rejects(train("qwen3_moe", [`${MODE}=R4`]), /router_replay\.mode=R4: must be one of disabled, R2, R3/);
  await assert.rejects(train("qwen3_moe", [`${ROLLOUT}=True`, "actor_rollout_ref.rollout.name=llama_cpp"]), /enable_rollout_routing_replay=True: rollout engine 'llama_cpp'.*cannot record/);
});
