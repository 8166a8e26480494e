// verl's FLOPs estimate (verl/utils/flops_counter.py) for each family, against counts worked out
// by hand from verl's formulas on small configs, and its device table.
import { test } from "node:test";
import assert from "node:assert/strict";
import { makeConfig, type ModelConfig } from "../../src/models/config.js";
import { DEVICE_FLOPS, FlopsCounter, getDeviceFlops } from "../../src/utils/flops_counter.js";

// V=32, H=16, I=40, L=2, 4 query heads, 2 kv heads, head_dim 4
const base = { vocabSize: 32, dim: 16, hiddenDim: 40, nLayers: 2, nHeads: 4, nKvHeads: 2 } as const;
const SEQLENS = [3, 5]; // tokens 8, Σ s² = 9 + 25 = 34

function flops(c: ModelConfig, seqlens = SEQLENS): number {
  return new FlopsCounter(c, "CPU").flops(seqlens);
}

test("llama, qwen2, mistral: 6 x dense parameters x tokens + 6 x Σ s² x head_dim x heads x layers", () => {
  // attention linears per layer: H x (q 4*4 + k 2*4 + v 2*4 + o 4*4) = 16 x 48 = 768
  // SwiGLU: H x I x 3 = 16 x 40 x 3 = 1920;  layers: (768 + 1920) x 2 = 5376;  embedding + head: 32 x 16 x 2 = 1024
  // dense N = 6400 -> 6 x 6400 x 8 tokens = 307200;  attention: 6 x 34 x 4 x 4 x 2 = 6528
  const expected = 307200 + 6528;
  for (const modelType of ["llama", "qwen2", "mistral"] as const) {
    assert.equal(flops(makeConfig({ ...base, modelType, attentionBias: modelType === "qwen2" })), expected, modelType);
  }
  // a llama2.c model has no model_type: llama, as its exported config.json says
  assert.equal(flops(makeConfig(base)), expected);
});

test("qwen3: the config's head_dim (8 here, not hidden_size / heads = 4) sizes q, k, v, o and the attention", () => {
  const c = makeConfig({ ...base, modelType: "qwen3", headDim: 8 });
  // attention linears: 16 x (32 + 16 + 16 + 32) = 1536;  layers: (1536 + 1920) x 2 = 6912;  + 1024 = 7936
  // 6 x 7936 x 8 = 380928;  attention: 6 x 34 x 8 x 4 x 2 = 13056
  assert.equal(flops(c), 380928 + 13056);
});

test("qwen3_moe: top-k experts of moe_intermediate_size plus the router, on every layer (verl ignores mlp_only_layers)", () => {
  const c = makeConfig({
    ...base, modelType: "qwen3_moe",
    moe: { numExperts: 8, topK: 2, intermediateSize: 12, normTopkProb: true, sparseLayers: [true, false], routerAuxLossCoef: 0.001, outputRouterLogits: false },
  });
  // experts: H x k x I_moe x 3 = 16 x 2 x 12 x 3 = 1152;  router: H x E = 128;  + attention 768 = 2048 per layer
  // (2048 x 2 + 1024) = 5120 -> 6 x 5120 x 8 = 245760;  attention 6528
  assert.equal(flops(c), 245760 + 6528);
});

test("gemma3_text: a sliding layer attends to min(s, window) keys per token", () => {
  const c = makeConfig({ ...base, modelType: "gemma3_text", slidingWindow: 4, slidingLayers: [true, false] });
  // dense part as llama: 307200.  attention: layer 0 (window 4): 3 x 3 + 5 x 4 = 29;  layer 1 (full): 34
  // 6 x (29 + 34) x 4 x 4 = 6048
  assert.equal(flops(c), 307200 + 6048);
});

test("gemma2 has no estimator in verl: 0 FLOPs, and one warning per model_type", () => {
  const lines: string[] = [];
  const c = makeConfig({ ...base, modelType: "gemma2" });
  const counter = new FlopsCounter(c, "CPU", (l) => lines.push(l));
  new FlopsCounter(c, "CPU", (l) => lines.push(l));
  assert.equal(counter.flops(SEQLENS), 0);
  assert.equal(counter.mfu(SEQLENS, 1), 0);
  assert.equal(lines.length, 1, lines.join("\n"));
  assert.match(lines[0]!, /not model_type gemma2; perf\/mfu and train\/mfu will be 0/);
});

test("the device table: verl's names, matched as substrings in reverse sorted order; unknown = infinite", () => {
  assert.equal(getDeviceFlops("CPU"), 448e9);
  assert.equal(getDeviceFlops("nvidia hopper NVIDIA H200"), 989e12);
  assert.equal(getDeviceFlops("NVIDIA H20"), 148e12, "H20 is not taken for H200");
  assert.equal(getDeviceFlops("NVIDIA GB200"), 2.5e15, "GB200 before B200");
  assert.equal(getDeviceFlops("NVIDIA L40S"), 362.05e12, "L40S before L40");
  assert.equal(getDeviceFlops("llvmpipe (LLVM 15.0.7, 256 bits)"), Infinity);
  assert.equal(Object.keys(DEVICE_FLOPS).length, 17);
});

test("mfu: FLOPs per second x passes / promised / world size; forward-only a third; unknown device gives 0", () => {
  const c = makeConfig(base);
  const counter = new FlopsCounter(c, "CPU");
  const perStep = 313728; // the llama count above
  assert.deepEqual(counter.estimateFlops(SEQLENS, 2), { estimated: perStep / 2, promised: 448e9 });
  const m = counter.mfu(SEQLENS, 2, { passes: 2, worldSize: 2 });
  assert.ok(Math.abs(m - ((perStep / 2) * 2) / 448e9 / 2) < 1e-18);
  assert.ok(Math.abs(counter.mfu(SEQLENS, 2, { forwardOnly: true }) - perStep / 2 / 448e9 / 3) < 1e-18);
  assert.equal(new FlopsCounter(c, "Some New GPU").mfu(SEQLENS, 2), 0);
  // longer sequences in the same time: more FLOPs per second
  assert.ok(counter.mfu([30, 50], 2) > counter.mfu(SEQLENS, 2));
});
