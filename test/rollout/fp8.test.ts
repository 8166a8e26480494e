// FP8 rollout (actor_rollout_ref.rollout.quantization=fp8): the e4m3 grid, verl's block scales,
// the key's refusals, and the host decoder's log-probs against the float32 trainer's.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Fp8Spec, E4M3_MAX, FP8_BLOCK, isFp8Weight, parseRolloutQuantization, quantizeActivations, quantizeBlockwise, roundBf16, roundE4m3, roundE4m3Clamped, roundF16, setRolloutQuantization } from "../../src/rollout/fp8.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { readParamsForDecode } from "../../src/rollout/decode_weights.js";
import { Rng } from "../../src/utils/rng.js";
import { initBackend } from "../../src/engine/backend.js";
import { ConfigError, loadConfig } from "../../src/config/index.js";
import { validatePpoNames } from "../../src/trainer/ppo/validate_names.js";
import { storiesBin, STORIES_MISSING, ONCE_UPON_A_TIME } from "../models/stories.js";
import { makeWorkspace } from "../trainer/ppo/trainer/fixtures.js";
import { grpoRolloutCorr, logProbGap, sampleWithLogProbs } from "./quantized_rollout.js";
import { ContinuousBatchingServer } from "../../src/agent_loop/batching_server.js";

/** Every finite float8 e4m3fn value >= 0, from its bits (sign 0, 4 exponent bits, bias 7, 3 mantissa bits; 0x7f is NaN). */
function e4m3Values(): number[] {
  const out: number[] = [];
  for (let b = 0; b < 0x7f; b++) {
    const e = b >> 3, m = b & 7;
    out.push(e === 0 ? (m / 8) * 2 ** -6 : (1 + m / 8) * 2 ** (e - 7));
  }
  return out;
}

test("e4m3 rounding: hand-computed values, ties to even, subnormals, saturation at 448", () => {
  const cases: [number, number][] = [
    [1, 1], [1.07, 1.125], [-1.07, -1.125],
    [1.0625, 1], // halfway between 1 (mantissa 000) and 1.125 (001): the even one
    [1.1875, 1.25], // halfway between 1.125 (001) and 1.25 (010)
    [232, 224], // step 16 in [128, 256): halfway between 224 (110) and 240 (111)
    [248, 256], // halfway between 240 (111) and 256 (next binade, 000)
    [3.3, 3.25], [0.3, 0.3125], [100, 96], [104, 104], [108, 112],
    [448, 448], [460, 448], [464, 448], [1e6, 448], [-1000, -448], [Infinity, 448],
    [2 ** -6, 2 ** -6], // least normal
    [2 ** -9, 2 ** -9], // least subnormal
    [2 ** -10, 0], // halfway between 0 and 2^-9: 0 is even
    [1.5 * 2 ** -10, 2 ** -9],
    [3 * 2 ** -10, 2 ** -8], // halfway between 1 and 2 subnormal steps: 2
    [0.0146, 7 * 2 ** -9], // in the subnormal range, steps of 2^-9: 7.475 steps
    [0.0155, 2 ** -6], // 7.936 steps rounds up into the least normal
    [1e-5, 0],
  ];
  for (const [x, want] of cases) assert.equal(roundE4m3(x), want, `e4m3(${x})`);
  assert.ok(Object.is(roundE4m3(-0), -0) && Object.is(roundE4m3(0), 0));
  assert.ok(Number.isNaN(roundE4m3(NaN)));
  const grid = e4m3Values();
  assert.equal(grid.length, 127);
  assert.equal(Math.max(...grid), E4M3_MAX);
  for (const v of grid) {
    assert.equal(roundE4m3(v), v, `${v} is on the grid`);
    assert.equal(roundE4m3(-v), -v);
  }
  // between two neighbours, everything below the midpoint goes down and above it up
  for (let i = 0; i + 1 < grid.length; i++) {
    const a = grid[i]!, b = grid[i + 1]!, mid = (a + b) / 2;
    assert.equal(roundE4m3(mid - (b - a) / 64), a);
    assert.equal(roundE4m3(mid + (b - a) / 64), b);
  }
  // the bit-level fast path the block loop uses agrees with the reference on float32 inputs within ±448
  const probe: number[] = [];
  for (let i = 0; i + 1 < grid.length; i++) {
    const a = grid[i]!, b = grid[i + 1]!, mid = (a + b) / 2;
    probe.push(a, mid, Math.fround(mid - (b - a) / 1024), Math.fround(mid + (b - a) / 1024));
  }
  const rng = new Rng(9);
  for (let i = 0; i < 20000; i++) probe.push(Math.fround((rng.random() * 2 - 1) * 2 ** (rng.random() * 22 - 12)));
  for (const x of probe) {
    const y = Math.max(-448, Math.min(448, Math.fround(x)));
    assert.equal(roundE4m3Clamped(y), roundE4m3(y), `fast e4m3(${y})`);
  }
  // the 16-bit casts applied before quantizing (vLLM's model dtype)
  assert.equal(roundBf16(1 + 2 ** -8), 1); // tie, to even
  assert.equal(roundBf16(1 + 3 * 2 ** -8), 1 + 2 ** -6);
  assert.equal(roundF16(1 + 2 ** -11), 1);
  assert.equal(roundF16(2 ** -24), 2 ** -24);
  assert.equal(roundF16(70000), 65504);
});

test("block scales as verl's fp8 kernel computes them: amax / 448 per 128 x 128 block, partial edge blocks", () => {
  assert.deepEqual(FP8_BLOCK, [128, 128]);
  const f = Math.fround;
  // [3, 5] in blocks of [2, 2]: scales [2, 3]
  const w = Float32Array.from([
    448, 1.0625, 0.5, -0.25, 0,
    -3, 2, 0.125, 0.1, 0,
    7, -7, 0, 0, 1e-3,
  ]);
  const spec = { blockSize: [2, 2] as [number, number], castTo: "f32" as const };
  const { values, scales } = quantizeBlockwise(w, 3, 5, spec);
  const amax = [448, 0.5, 0, 7, 0, f(1e-3)];
  const want = amax.map((a) => f(Math.max(a, f(1e-10)) / 448));
  assert.deepEqual([...scales], want);
  // block (0,0): scale 1, values on the e4m3 grid as they are (1.0625 ties to 1)
  assert.deepEqual([values[0], values[1], values[5], values[6]], [448, 1, -3, 2]);
  // every value: e4m3(x * (1 / scale)) * scale in float32
  const blockOf = (r: number, c: number) => Math.floor(r / 2) * 3 + Math.floor(c / 2);
  for (let r = 0; r < 3; r++) {
    for (let c = 0; c < 5; c++) {
      const s = want[blockOf(r, c)]!, inv = f(1 / s);
      const q = roundE4m3(Math.max(-448, Math.min(448, f(w[r * 5 + c]! * inv))));
      assert.equal(values[r * 5 + c], f(q * s), `[${r}, ${c}]`);
    }
  }
  // a block's largest value comes back within one rounding of itself; a zero block stays zero
  assert.ok(Math.abs(values[14]! - 1e-3) < 1e-9);
  assert.deepEqual([values[4], values[9]], [0, 0]);
  // 0.1 in a block of max 0.5: 0.1 * 896 = 89.6 -> 88 (steps of 8 in [64, 128)) -> 88 / 896
  assert.equal(values[8], f(88 * want[1]!));
  // bf16 first (verl casts to vLLM's dtype), then the block: 1 + 2^-8 is 1 in bf16
  const b = quantizeBlockwise(Float32Array.from([1 + 2 ** -8, 448]), 1, 2, { blockSize: [128, 128], castTo: "bf16" });
  assert.deepEqual([...b.values], [1, 448]);
  // the block loop's bf16 cast (on the bits) is the reference rounding
  const rng = new Rng(4), x = Float32Array.from({ length: 4096 }, () => (rng.random() * 2 - 1) * 2 ** (rng.random() * 20 - 10));
  const viaBits = quantizeBlockwise(x, 64, 64, { blockSize: [128, 128], castTo: "bf16" }).values;
  const viaRef = quantizeBlockwise(x.map(roundBf16), 64, 64, { blockSize: [128, 128], castTo: "f32" }).values;
  assert.deepEqual([...viaBits], [...viaRef]);
});

test("activations as vLLM's per-token group quantization: each row's groups of 128 (here 2) scaled by amax / 448", () => {
  const f = Math.fround;
  // rows [1, -0.1, 3] and [0, 0, -448] in groups of 2 columns: [1, -0.1] [3] / [0, 0] [-448]
  const x = Float32Array.from([1, -0.1, 3, 0, 0, -448, 9, 9, 9]);
  quantizeActivations(x, 2, 3, 2);
  const s = f(1 / 448);
  // -0.1 / s = -44.8 -> -44 (steps of 4 in [32, 64)); each group's largest value comes back to itself within a rounding
  assert.deepEqual([...x.subarray(0, 6)], [f(448 * s), f(-44 * s), f(448 * f(3 / 448)), 0, 0, -448]);
  assert.deepEqual([...x.subarray(6)], [9, 9, 9], "rows past `rows` untouched");
});

test("the layers vLLM quantizes: linear weights only", () => {
  for (const n of ["model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.layers.2.mlp.experts.7.up_proj.weight"]) assert.ok(isFp8Weight(n), n);
  for (const n of ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias",
    "model.layers.0.self_attn.q_norm.weight", "model.layers.0.mlp.gate.weight"]) assert.ok(!isFp8Weight(n), n);
});

test("rollout.quantization: fp8 built, unknown values refused by key and value, config file's block size honoured", () => {
  const keys = { quantization: "actor_rollout_ref.rollout.quantization", configFile: "actor_rollout_ref.rollout.quantization_config_file" };
  const base = { quantization: null as string | null, configFile: null as string | null, dtype: "float32", engine: "tfjs" };
  const warned: string[] = [];
  assert.equal(parseRolloutQuantization(base, keys), undefined);
  assert.deepEqual(parseRolloutQuantization({ ...base, quantization: "fp8" }, keys), { blockSize: [128, 128], castTo: "f32" });
  assert.deepEqual(parseRolloutQuantization({ ...base, quantization: "fp8", dtype: "bfloat16", engine: "vllm" }, keys), { blockSize: [128, 128], castTo: "bf16" });
  assert.throws(() => parseRolloutQuantization({ ...base, quantization: "torchao" }, keys), /actor_rollout_ref\.rollout\.quantization=torchao needs actor_rollout_ref\.rollout\.quantization_config_file/);
  assert.throws(() => parseRolloutQuantization({ ...base, quantization: "awq" }, keys), /actor_rollout_ref\.rollout\.quantization=awq: verl accepts fp8 or torchao/);
  assert.throws(() => parseRolloutQuantization({ ...base, quantization: "fp8", engine: "llama_cpp" }, keys), /quantization=fp8 with rollout\.name=llama_cpp/);
  const dir = mkdtempSync(join(tmpdir(), "fp8-"));
  try {
    const file = (name: string, body: unknown) => { const p = join(dir, name); writeFileSync(p, JSON.stringify(body)); return p; };
    const b64 = file("b64.json", { quantization_config: { quant_method: "fp8", fmt: "e4m3", weight_block_size: [64, 64] } });
    assert.deepEqual((parseRolloutQuantization({ ...base, quantization: "fp8", configFile: b64 }, keys, (l) => warned.push(l)) as Fp8Spec).blockSize, [64, 64]);
    assert.match(warned.pop()!, /quantization_config_file: fp8 weight blocks of 64 x 64 \(verl's vLLM\/SGLang fp8 path keeps 128 x 128/);
    assert.deepEqual((parseRolloutQuantization({ ...base, quantization: "fp8", configFile: file("none.json", {}) }, keys) as Fp8Spec).blockSize, [128, 128]);
    assert.throws(() => parseRolloutQuantization({ ...base, quantization: "fp8", configFile: file("e5.json", { fmt: "e5m2" }) }, keys), /quantization_config_file=.*e5\.json: fmt="e5m2" is not built/);
    assert.throws(() => parseRolloutQuantization({ ...base, quantization: "fp8", configFile: file("st.json", { activation_scheme: "static" }) }, keys), /activation_scheme="static" is not built/);
    assert.throws(() => parseRolloutQuantization({ ...base, quantization: "fp8", configFile: join(dir, "absent.json") }, keys), /quantization_config_file=.*absent\.json: no such file/);
    parseRolloutQuantization({ ...base, configFile: b64 }, keys, (l) => warned.push(l));
    assert.match(warned.pop()!, /has no effect without actor_rollout_ref\.rollout\.quantization/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("stories260K: the host decoder with fp8 weights gives log-probs a little off the float32 trainer's; off restores them", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin);
  try {
    const run = () => sampleWithLogProbs(m);
    const plain = await run();
    const off = await logProbGap(m, plain);
    setRolloutQuantization(m, { blockSize: [128, 128], castTo: "f32" });
    const fp8 = await run();
    const on = await logProbGap(m, fp8);
    setRolloutQuantization(m, undefined);
    const again = await run();
    assert.ok(off.max < 1e-4, `float32 rollout vs trainer: ${off.max}`);
    assert.ok(on.mean > 1e-3 && on.mean > 50 * off.mean, `fp8 rollout vs trainer: mean ${on.mean} (float32: ${off.mean})`);
    assert.ok(on.mean < 0.2, `fp8 rollout vs trainer too far: mean ${on.mean}`);
    // turning it off gives the float32 rollout back, token for token
    assert.deepEqual([...again.batch["responses"]!.data], [...plain.batch["responses"]!.data]);
    assert.deepEqual([...again.batch["rollout_log_probs"]!.data], [...plain.batch["rollout_log_probs"]!.data]);
  } finally {
    setRolloutQuantization(m, undefined);
    m.dispose();
  }
});

test("GRPO on stories260K, 2 steps: rollout_corr/kl shows the fp8 rollout's mismatch, and is ~0 without it", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const ws = await makeWorkspace();
  try {
    const kl = (extra: string[]) => grpoRolloutCorr(ws, bin, extra);
    const off = await kl([`trainer.default_local_dir=${ws.dir}/off`]);
    const on = await kl([`trainer.default_local_dir=${ws.dir}/on`, "actor_rollout_ref.rollout.quantization=fp8"]);
    assert.equal(off.length, 2);
    assert.equal(on.length, 2);
    for (let s = 0; s < 2; s++) {
      const [klOn, k3On] = on[s]!, [klOff, k3Off] = off[s]!;
      assert.ok(Math.abs(klOff) < 1e-5 && k3Off < 1e-8, `step ${s + 1} float32 rollout: rollout_corr/kl ${klOff}, k3_kl ${k3Off}`);
      console.log(`step ${s + 1}: rollout_corr/kl fp8 ${klOn}, float32 ${klOff}; k3_kl fp8 ${k3On}, float32 ${k3Off}`);
      // a mean of log-ratios over few sampled tokens: its sign is noise, its size is the mismatch
      assert.ok(Math.abs(klOn) > 1e-4 && Math.abs(klOn) > 20 * Math.abs(klOff), `step ${s + 1} fp8 rollout: rollout_corr/kl ${klOn} (float32 ${klOff})`);
      assert.ok(k3On > 100 * k3Off && k3On < 0.05, `step ${s + 1} fp8 rollout: rollout_corr/k3_kl ${k3On} (float32 ${k3Off})`);
    }
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("a PPO config with a quantization verl-ts does not build fails before any worker starts, naming key and value", () => {
  const cfg = (q: string, extra: string[] = []) => loadConfig({ configName: "ppo_trainer", overrides: [`actor_rollout_ref.rollout.quantization=${q}`, ...extra] });
  assert.throws(() => validatePpoNames(cfg("awq")), (e: unknown) => e instanceof ConfigError && e.exitCode === 2 && /actor_rollout_ref\.rollout\.quantization=awq/.test(e.message));
  assert.throws(() => validatePpoNames(cfg("torchao")), /actor_rollout_ref\.rollout\.quantization=torchao needs actor_rollout_ref\.rollout\.quantization_config_file/);
  assert.throws(() => validatePpoNames(cfg("fp8", ["actor_rollout_ref.rollout.name=llama_cpp"])), /quantization=fp8 with rollout\.name=llama_cpp/);
  validatePpoNames(cfg("fp8", ["actor_rollout_ref.rollout.name=vllm"]));
});

test("agent loops' batching server decodes the fp8 weights too: generate's fp8 tokens and log-probs", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin);
  try {
    const prompts = [ONCE_UPON_A_TIME, [1, 403]], R = 16;
    const serve = async () => {
      const server = new ContinuousBatchingServer(m, { maxNumSeqs: 2, maxModelLen: 64, eosTokenIds: [], rng: new Rng(0) });
      await server.wakeUp();
      const outs = await Promise.all(prompts.map((p, i) => server.generate(`r${i}`, p, { temperature: 0, topP: 1, topK: -1, maxTokens: R, logprobs: true })));
      await server.sleep();
      return outs;
    };
    const plain = await serve();
    setRolloutQuantization(m, { blockSize: [128, 128], castTo: "f32" });
    const served = await serve();
    await readParamsForDecode(m);
    const ref = generate(m, leftPadPrompts(prompts, 0), defaultSamplingParams({ temperature: 0, responseLength: R, eosTokenIds: [], padTokenId: 0, calculateLogProbs: true }), new Rng(0));
    const lp = ref.batch["rollout_log_probs"]!.data;
    served.forEach((o, b) => {
      assert.deepEqual(o.tokenIds, Array.from(ref.batch["responses"]!.data.subarray(b * R, (b + 1) * R)));
      o.logProbs!.forEach((v, j) => assert.ok(Math.abs(v - lp[b * R + j]!) < 1e-5, `row ${b} token ${j}: ${v} vs ${lp[b * R + j]}`));
    });
    const moved = served.some((o, b) => o.logProbs!.some((v, j) => Math.abs(v - plain[b]!.logProbs![j]!) > 1e-3));
    assert.ok(moved, "fp8 weights move the served log-probs");
  } finally {
    setRolloutQuantization(m, undefined);
    m.dispose();
  }
});
