// torchao rollout (actor_rollout_ref.rollout.quantization=torchao with quantization_config_file): torchao's
// rounding of each built scheme on hand-made values, the config file's refusals, and the host decoder's
// log-probs against the float32 trainer's, then a GRPO run.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseRolloutQuantization, setRolloutQuantization } from "../../src/rollout/fp8.js";
import { isTorchaoWeight, quantizeFloat8Rowwise, quantizeInt4, quantizeInt8, readTorchaoConfigFile, torchaoRolloutWeight, type TorchaoSpec } from "../../src/rollout/torchao.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { initBackend } from "../../src/engine/backend.js";
import { storiesBin, STORIES_MISSING } from "../models/stories.js";
import { makeWorkspace } from "../trainer/ppo/trainer/fixtures.js";
import { grpoRolloutCorr, logProbGap, sampleWithLogProbs } from "./quantized_rollout.js";

const f = Math.fround;

/** verl's example config file (torchao's config_to_dict of Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())). */
const FLOAT8_PER_ROW = {
  _type: "Float8DynamicActivationFloat8WeightConfig", _version: 2,
  _data: {
    activation_dtype: { _type: "torch.dtype", _data: "float8_e4m3fn" }, weight_dtype: { _type: "torch.dtype", _data: "float8_e4m3fn" },
    granularity: [{ _type: "PerRow", _version: 1, _data: {} }, { _type: "PerRow", _version: 1, _data: {} }],
    mm_config: { _type: "Float8MMConfig", _version: 1, _data: { emulate: false, use_fast_accum: true, pad_inner_dim: false } },
    activation_value_lb: null, activation_value_ub: null, kernel_preference: { _type: "KernelPreference", _data: "AUTO" }, set_inductor_config: true,
  },
};

test("float8 rowwise: the weight in bfloat16, scale = bf16(amax / 448) per row, values rounded to e4m3 (ties to even, subnormals)", () => {
  const w = Float32Array.of(
    448, 1.0625, -3.3, 2 ** -8, // scale 1: 1.0625 ties to 1; -3.3 is -3.296875 in bf16, then -3.25 in e4m3; 2^-8 a subnormal
    7, -0.1, 0, 0, // scale 2^-6: -0.1 is -0.10009765625 in bf16, / 2^-6 = -6.40625 -> -6.5
    1, 0, 0, 0, // scale bf16(1/448) = 1.140625 * 2^-9, so 1 / scale rounds to 448 and comes back as 511/512
    0, 0, 0, 0, // an all-zero row stays zero
  );
  assert.deepEqual([...quantizeFloat8Rowwise(w, 4, 4)], [448, 1, -3.25, 2 ** -8, 7, f(-6.5 * 2 ** -6), 0, 0, 511 / 512, 0, 0, 0, 0, 0, 0, 0]);
});

test("int8 weight-only: symmetric, scale = amax / 127.5, round half to even, clamped to [-128, 127]; per row or per group", () => {
  const row = Float32Array.of(127.5, 2.5, -12.75, 0.49);
  // per row: scale 1; 127.5 -> 128 (ties to even) -> 127 (clamped), 2.5 -> 2 (ties to even), -12.75 -> -13, 0.49 -> 0
  assert.deepEqual([...quantizeInt8(row, 1, 4, 4, "f32")], [127, 2, -13, 0]);
  // groups of 2: [127.5, 2.5] keeps scale 1; [-12.75, 0.49] gets scale 0.1 (1 / scale = 10): -127.5 -> -128, 4.9 -> 5
  assert.deepEqual([...quantizeInt8(row, 1, 4, 2, "f32")], [127, 2, f(-128 * f(0.1)), f(5 * f(0.1))]);
  // an all-zero group: the scale floor (2^-23) keeps it zero
  assert.deepEqual([...quantizeInt8(new Float32Array(4), 1, 4, 4, "f32")], [0, 0, 0, 0]);
});

test("int4 weight-only (plain): asymmetric per group, scale = (max - min) / 15, zero = min + 8 * scale, round half to even", () => {
  // group 1: min 0, max 7.5, scale 0.5: 1.25 / 0.5 = 2.5 -> 2 (ties to even), 2.6 -> 5.2 -> 5
  // group 2: min -1, max 6.5, scale 0.5, zero 3: -0.75 -> 0.5 -> 0 (ties to even), so -1
  const w = Float32Array.of(0, 1.25, 2.6, 7.5, -1, -0.75, 0, 6.5);
  assert.deepEqual([...quantizeInt4(w, 1, 8, 4, "f32")], [0, 1, 2.5, 7.5, -1, -1, 0, 6.5]);
  // a constant group: the 1e-6 floor on max - min keeps it (to float32 rounding)
  const c = quantizeInt4(Float32Array.of(0.25, 0.25), 1, 2, 2, "f32");
  assert.ok(Math.abs(c[0]! - 0.25) < 1e-6 && c[0] === c[1]);
});

test("which weights, as vLLM's torchao method and torchao's own checks pick them", () => {
  assert.ok(isTorchaoWeight("model.layers.3.self_attn.k_proj.weight") && isTorchaoWeight("model.layers.0.mlp.down_proj.weight"));
  // vLLM quantizes LinearBase layers: not the fused MoE experts, the router, embeddings or lm_head
  for (const n of ["model.layers.0.mlp.experts.2.up_proj.weight", "model.layers.0.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.bias"]) assert.ok(!isTorchaoWeight(n), n);
  const w = Float32Array.from({ length: 32 * 48 }, (_, i) => Math.sin(i) * 0.3);
  const float8: TorchaoSpec = { scheme: { config: "Float8DynamicActivationFloat8WeightConfig" }, castTo: "bf16" };
  assert.notDeepEqual(torchaoRolloutWeight("model.layers.0.mlp.up_proj.weight", w, [32, 48], float8, 64), w);
  // _scaled_mm needs both sides of the fused matrix to be multiples of 16: stories260K's gate_up (2 x 172 rows) stays as is
  assert.equal(torchaoRolloutWeight("model.layers.0.mlp.up_proj.weight", w, [32, 48], float8, 344), w);
  // int4 skips a weight whose rows do not split into groups
  assert.equal(torchaoRolloutWeight("model.layers.0.mlp.up_proj.weight", w, [32, 48], { scheme: { config: "Int4WeightOnlyConfig", groupSize: 32 }, castTo: "f32" }, 32), w);
  assert.throws(() => torchaoRolloutWeight("model.layers.0.mlp.up_proj.weight", w, [32, 48], { scheme: { config: "Int8WeightOnlyConfig", group: 32 }, castTo: "f32" }, 32), /48 are not a whole number of groups of 32/);
});

test("quantization_config_file: torchao's config_to_dict JSON; the built schemes read, the others refused by name", () => {
  const dir = mkdtempSync(join(tmpdir(), "torchao-"));
  const keys = { quantization: "actor_rollout_ref.rollout.quantization", configFile: "actor_rollout_ref.rollout.quantization_config_file" };
  const file = (name: string, body: unknown) => { const p = join(dir, name); writeFileSync(p, JSON.stringify(body)); return p; };
  const read = (body: unknown, castTo: TorchaoSpec["castTo"] = "f32") => readTorchaoConfigFile(file("c.json", body), castTo, keys);
  try {
    assert.deepEqual(read(FLOAT8_PER_ROW), { scheme: { config: "Float8DynamicActivationFloat8WeightConfig" }, castTo: "bf16" });
    assert.deepEqual(read({ _type: "Int8WeightOnlyConfig", _version: 2, _data: {} }, "bf16"), { scheme: { config: "Int8WeightOnlyConfig", group: "row" }, castTo: "bf16" });
    assert.deepEqual(read({ _type: "Int8WeightOnlyConfig", _version: 2, _data: { granularity: { _type: "PerGroup", _version: 1, _data: { group_size: 32 } } } }).scheme, { config: "Int8WeightOnlyConfig", group: 32 });
    assert.deepEqual(read({ _type: "Int4WeightOnlyConfig", _version: 2, _data: { group_size: 32, int4_packing_format: { _type: "Int4PackingFormat", _data: "PLAIN" } } }).scheme, { config: "Int4WeightOnlyConfig", groupSize: 32 });
    assert.throws(() => read({ ...FLOAT8_PER_ROW, _data: { ...FLOAT8_PER_ROW._data, granularity: null } }), /Float8DynamicActivationFloat8WeightConfig with granularity null \(PerTensor\)\/null \(PerTensor\): only PerRow is .*fused/);
    assert.throws(() => read({ _type: "Int8WeightOnlyConfig", _version: 2, _data: { granularity: { _type: "PerTensor", _data: {} } } }), /Int8WeightOnlyConfig with granularity PerTensor .* is not built/);
    assert.throws(() => read({ _type: "Int4WeightOnlyConfig", _version: 2, _data: { int4_packing_format: { _type: "Int4PackingFormat", _data: "TILE_PACKED_TO_4D" } } }), /int4_packing_format TILE_PACKED_TO_4D .* is not built/);
    assert.throws(() => read({ _type: "Int8DynamicActivationInt8WeightConfig", _version: 2, _data: {} }), /c\.json: torchao's Int8DynamicActivationInt8WeightConfig is not built \(verl-ts builds Float8DynamicActivationFloat8WeightConfig/);
    assert.throws(() => read({ _type: "Int4WeightOnlyConfig", _version: 1, _data: {} }), /version 1 .* is not built/);
    assert.throws(() => readTorchaoConfigFile(join(dir, "absent.json"), "f32", keys), /quantization_config_file=.*absent\.json: no such file/);
    // through the key: torchao needs the file; verl's SGLang rollout takes fp8 only
    const base = { quantization: "torchao", configFile: file("ok.json", FLOAT8_PER_ROW), dtype: "float32", engine: "vllm" };
    assert.ok(parseRolloutQuantization(base, keys));
    assert.throws(() => parseRolloutQuantization({ ...base, engine: "sglang" }, keys), /quantization=torchao with rollout\.name=sglang: verl's SGLang rollout quantizes with fp8 only/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("stories260K: each built torchao scheme moves the host decoder's log-probs off the float32 trainer's, int4 most", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("wasm");
  const m = loadLlama2c(bin);
  try {
    const gap = async (spec: TorchaoSpec | undefined) => {
      setRolloutQuantization(m, spec);
      return (await logProbGap(m, await sampleWithLogProbs(m))).mean;
    };
    const off = await gap(undefined);
    const float8 = await gap({ scheme: { config: "Float8DynamicActivationFloat8WeightConfig" }, castTo: "bf16" });
    const int8 = await gap({ scheme: { config: "Int8WeightOnlyConfig", group: "row" }, castTo: "f32" });
    const int4 = await gap({ scheme: { config: "Int4WeightOnlyConfig", groupSize: 32 }, castTo: "f32" });
    console.log(`mean |rollout - trainer log-prob|: float32 ${off}, float8 rowwise ${float8}, int8 ${int8}, int4 g32 ${int4}`);
    assert.ok(off < 1e-5, `float32: ${off}`);
    for (const [name, v] of [["float8", float8], ["int8", int8], ["int4", int4]] as const) assert.ok(v > 20 * off && v > 1e-4 && v < 0.5, `${name}: ${v} (float32 ${off})`);
    assert.ok(int4 > int8, `int4 (${int4}) is coarser than int8 (${int8})`);
  } finally {
    setRolloutQuantization(m, undefined);
    m.dispose();
  }
});

test("GRPO on stories260K, 2 steps, quantization=torchao with verl's float8 rowwise config file: rollout_corr/kl small but not zero", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const ws = await makeWorkspace();
  try {
    const cfgFile = join(ws.dir, "torchao_config.json");
    writeFileSync(cfgFile, JSON.stringify(FLOAT8_PER_ROW));
    const steps = await grpoRolloutCorr(ws, bin, ["actor_rollout_ref.rollout.quantization=torchao", `actor_rollout_ref.rollout.quantization_config_file=${cfgFile}`]);
    assert.equal(steps.length, 2);
    steps.forEach(([kl, k3], s) => {
      console.log(`step ${s + 1}: rollout_corr/kl ${kl}, k3_kl ${k3}`);
      // the float32 rollout's are below 1e-5 and 1e-8 (fp8.test.ts)
      assert.ok(Math.abs(kl) > 1e-4 && k3 > 1e-6 && k3 < 0.05, `step ${s + 1}: rollout_corr/kl ${kl}, k3_kl ${k3}`);
    });
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
