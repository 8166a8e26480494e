// Frozen stacks packed once (src/engine/frozen_weights.ts): LoRA's fused base weights under 16-bit
// products, with H padded to empty slots (lora_linear.ts's slotCount: 3 slots of rank 8 laid out as 8).
// Where an adapter has the tensor cores: loraLinear's value and gradients equal the per-pass
// concatenation's with u slots (VERL_FROZEN_PACK=0 VERL_LORA_PAD_SLOTS=0) within f16 rounding; a second pass packs nothing
// and runs fewer kernels; weights given new data are seen, and the old words freed; the live tensor
// count stays flat. The layouts' padding rule is checked on any machine.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { dispatches, relErr, webgpuOrReason } from "./webgpu_adapter.js";
import { setMatmulPrecision, tensorCoreSupport, layoutsShareWords } from "../../src/engine/webgpu_kernels.js";
import { DEFAULT_DIRECT_TILE } from "../../src/engine/webgpu_gemm.js";
import { frozenStackCounts } from "../../src/engine/frozen_weights.js";
import { onRelease } from "../../src/engine/data_release.js";
import { loraLinear, type LoraBlock } from "../../src/models/lora_linear.js";

// These tests look inside LoRA's unmerged form; the merged one, WebGPU's default, is test/models/lora_merged.test.ts's.
process.env.VERL_LORA_MERGED = "0";

test("a weight's two product layouts share packed words only where both pad alike", () => {
  const t = DEFAULT_DIRECT_TILE; // n pads to 128, k to 16
  assert.equal(layoutsShareWords(1152, 896, t), true, "the 0.5B q/k/v stack");
  assert.equal(layoutsShareWords(9728, 896, t), true, "the 0.5B gate/up stack");
  assert.equal(layoutsShareWords(1152, 900, t), false, "900 pads to 912 as K, 1024 as N");
  assert.equal(layoutsShareWords(200, 896, t), false, "200 rows pad to 208 as K, 256 as N");
});

/** Runs fn with the frozen stacks and the padded slots on, or both off (the per-pass stack and u slots, as before). */
test("onRelease: runs once the backend releases the data, after its last reference (a clone) is gone", async () => {
  await tf.setBackend("cpu");
  const w = tf.ones([4, 4]), copy = tf.clone(w), other = tf.zeros([2]);
  let calls = 0;
  onRelease(tf.backend() as unknown as Parameters<typeof onRelease>[0], w.dataId, () => calls++);
  other.dispose();
  w.dispose();
  assert.equal(calls, 0, "the clone still holds the data");
  copy.dispose();
  assert.equal(calls, 1);
  const x = tf.ones([2]);
  x.dispose();
  assert.equal(calls, 1, "once");
});

function withFrozenPack<T>(on: boolean, fn: () => T): T {
  const before = [process.env.VERL_FROZEN_PACK, process.env.VERL_LORA_PAD_SLOTS];
  process.env.VERL_FROZEN_PACK = process.env.VERL_LORA_PAD_SLOTS = on ? "1" : "0";
  try { return fn(); } finally {
    ["VERL_FROZEN_PACK", "VERL_LORA_PAD_SLOTS"].forEach((k, i) => { if (before[i] === undefined) delete process.env[k]; else process.env[k] = before[i]; });
  }
}

test("LoRA's fused base weights packed once: same values and gradients as the per-pass stack, fewer kernels, new data seen, flat tensors", async (t) => {
  const why = await webgpuOrReason();
  if (why) return t.skip(why);
  if (!tensorCoreSupport.available) return t.skip(`no tensor cores on this adapter (${tensorCoreSupport.reason})`);
  const N = 300, inF = 256, outs = [256, 128, 128], r = 8;
  let seed = 1;
  const rnd = (shape: number[], s = 0.05) => tf.randomNormal(shape, 0, s, "float32", seed++);
  // variables that alone hold their data (tf.variable shares its initial tensor's): assigning new
  // data then releases the old, which is what frees the old stack's words
  const frozen = (t: tf.Tensor) => { const v = tf.variable(t as tf.Tensor2D, false); t.dispose(); return v; };
  const ws = outs.map((o) => frozen(rnd([o, inF])));
  const as = outs.map(() => tf.variable(rnd([r, inF], 0.2) as tf.Tensor2D));
  const bs = outs.map((o) => tf.variable(rnd([o, r], 0.2) as tf.Tensor2D));
  const x = rnd([N, inF], 1) as tf.Tensor2D, dy = rnd([N, outs.reduce((p, q) => p + q, 0)], 1);
  const blocks = (): LoraBlock[] => ws.map((w, j) => ({ w, a: as[j]!, b: bs[j]! }));
  const run = () => {
    const f = (xx: tf.Tensor, ...ab: tf.Tensor[]) => tf.sum(tf.mul(loraLinear(xx as tf.Tensor2D, ws.map((w, j) => ({ w, a: ab[j] as tf.Tensor2D, b: ab[outs.length + j] as tf.Tensor2D })), 2), dy));
    const g = tf.grads(f)([x, ...as, ...bs]);
    return { y: loraLinear(x, blocks(), 2), g };
  };
  setMatmulPrecision("f16");
  try {
    const before = { stacks: frozenStackCounts.stacks, packs: frozenStackCounts.packs };
    const ref = withFrozenPack(false, () => dispatches(run));
    const first = withFrozenPack(true, () => dispatches(run));
    assert.equal(frozenStackCounts.stacks - before.stacks, 1, "one stack for the call site");
    const packsAfterFirst = frozenStackCounts.packs;
    tf.dispose([first.out.y, ...first.out.g]);
    const n0 = tf.memory().numTensors;
    const second = withFrozenPack(true, () => dispatches(run));
    assert.equal(frozenStackCounts.packs, packsAfterFirst, "the second pass packs nothing");
    t.diagnostic(`kernels a pass: ${ref.n} with the stack concatenated and packed each pass and u slots, ${second.n} packed once and padded slots`);
    assert.ok(second.n < ref.n, `${second.n} kernels against ${ref.n}`);
    const e = await relErr(second.out.y, ref.out.y);
    t.diagnostic(`value against the per-pass stack: ${e.toExponential(2)}`);
    assert.ok(e < 2e-3, `value ${e}`);
    for (let i = 0; i < ref.out.g.length; i++) {
      const ge = await relErr(second.out.g[i]!, ref.out.g[i]!);
      assert.ok(ge < 5e-3, `gradient ${i}: ${ge}`);
    }
    tf.dispose([second.out.y, ...second.out.g]);
    // new data in a frozen weight (a checkpoint loaded into the variables): the stack follows it
    const fresh = rnd([outs[1]!, inF]);
    ws[1]!.assign(fresh as tf.Tensor2D);
    fresh.dispose();
    const refNew = withFrozenPack(false, run), now = withFrozenPack(true, run);
    const eNew = await relErr(now.y, refNew.y);
    assert.ok(eNew < 2e-3, `after new data: ${eNew}`);
    const moved = await relErr(now.y, ref.out.y);
    assert.ok(moved > 1e-2, `the product changed with the weight (${moved})`);
    tf.dispose([refNew.y, ...refNew.g, now.y, ...now.g]);
    for (let i = 0; i < 3; i++) { const o = withFrozenPack(true, run); tf.dispose([o.y, ...o.g]); }
    assert.equal(tf.memory().numTensors, n0, "the live tensor count stays flat (the old stack's words were freed)");
    tf.dispose([ref.out.y, ...ref.out.g]);
  } finally {
    setMatmulPrecision("f32");
    tf.dispose([...as, ...bs, x, dy]);
  }
  // the weights' release frees the stack's words too: one tensor more than the three disposed here
  const before = tf.memory().numTensors;
  tf.dispose(ws);
  assert.equal(tf.memory().numTensors, before - 3 - 1, "disposed weights take their packed stack with them");
});
