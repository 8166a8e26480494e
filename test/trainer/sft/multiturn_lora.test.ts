// Multi-turn SFT as verl's MultiTurnSFTDataset masks it (loss on the assistant turns only,
// past each turn's generation prompt, from the chat template), and LoRA for SFT with the
// PPO actor's keys: only the adapter trains and the checkpoint holds it in peft's layout.
import { test } from "node:test";
import assert from "node:assert/strict";
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as tf from "@tensorflow/tfjs";
import { saveLoraAdapter } from "../../../src/models/peft.js";
import { CharTokenizer } from "../../../src/models/tokenizers/index.js";
import {
  buildMultiTurnExample, readMultiTurnConfig, systemAndGenerationPrompt, tokenizeConversation,
} from "../../../src/trainer/sft/multiturn_sft_dataset.js";
import { SFTWorker } from "../../../src/workers/sft/sft_worker.js";
import { tinySftConfig, toyBatch } from "./helpers.js";

const CHATML = "{% for message in messages %}{% if loop.first and message.role != 'system' %}<|im_start|>system\nBe brief.<|im_end|>\n{% endif %}" +
  "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const ASCII = Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)).join("") + "\n";
const tok = new CharTokenizer(ASCII, CHATML);
const cfg = (extra: Record<string, unknown> = {}) => readMultiTurnConfig({ max_length: 200, ...extra }, {}, "data");
const CONV = {
  messages: [
    { role: "user", content: "2+2?" }, { role: "assistant", content: "4" },
    { role: "user", content: "and 3+3?" }, { role: "assistant", content: "6" },
  ],
  where: "row 0",
};

test("the template's default system prompt and generation prompt, as verl extracts them", () => {
  const p = systemAndGenerationPrompt(tok, {});
  assert.equal(tok.decode(p.system), "<|im_start|>system\nBe brief.<|im_end|>\n");
  assert.equal(tok.decode(p.generation), "<|im_start|>assistant\n");
});

test("loss on exactly the assistant turns' text and end tags; the ids equal the whole conversation rendered at once", () => {
  const c = cfg(), prompts = systemAndGenerationPrompt(tok, {});
  const { ids, tokenMask } = tokenizeConversation(tok, CONV, c, prompts);
  const whole = tok.encode(tok.applyChatTemplate(CONV.messages), { addSpecialTokens: false });
  assert.deepEqual(ids, whole);
  assert.equal(tok.decode(ids.filter((_, t) => tokenMask[t])), "4<|im_end|>\n6<|im_end|>\n");
  // the example weighs position t by token t+1 (the prediction it makes)
  const ex = buildMultiTurnExample(ids, tokenMask, c, tok.padTokenId, "row 0");
  const predicted = [...ex.lossMask].flatMap((m, t) => (m ? [ex.inputIds[t + 1]!] : []));
  assert.equal(tok.decode(predicted), "4<|im_end|>\n6<|im_end|>\n");
  assert.deepEqual([...ex.positionIds.subarray(0, 3)], [0, 1, 2]);
  assert.equal(ex.attentionMask.reduce((a, b) => a + b, 0), ids.length);
});

test("a template that renders turns differently as a whole is an error naming ignore_input_ids_mismatch; the flag accepts it", () => {
  const odd = tok.withChatTemplate(CHATML.replace("{% endfor %}", "{% if loop.last and loop.length > 1 %}#{% endif %}{% endfor %}"));
  const prompts = systemAndGenerationPrompt(odd, {});
  assert.throws(() => tokenizeConversation(odd, CONV, cfg(), prompts), /row 0: .*differs from the whole conversation.*ignore_input_ids_mismatch=true/);
  const { ids } = tokenizeConversation(odd, CONV, cfg({ ignore_input_ids_mismatch: true }), prompts);
  assert.ok(ids.length > 0);
});

test("truncation: error names the row and max_length; left keeps the end; no_padding cuts on the right whatever truncation says", () => {
  const { ids, tokenMask } = tokenizeConversation(tok, CONV, cfg(), systemAndGenerationPrompt(tok, {}));
  assert.throws(() => buildMultiTurnExample(ids, tokenMask, cfg({ max_length: 20 }), 0, "row 7"), /row 7: the conversation is \d+ tokens, longer than data.max_length=20/);
  const left = buildMultiTurnExample(ids, tokenMask, cfg({ max_length: 20, truncation: "left" }), 0, "row 7");
  assert.deepEqual([...left.inputIds], ids.slice(ids.length - 20));
  const np = buildMultiTurnExample(ids, tokenMask, cfg({ max_length: 20, truncation: "error", pad_mode: "no_padding" }), 0, "row 7");
  assert.deepEqual([...np.inputIds], ids.slice(0, 20));
  assert.throws(() => readMultiTurnConfig({ pad_mode: "left" }, {}, "data"), /data.pad_mode must be one of right, no_padding/);
});

test("LoRA for SFT: model.lora_rank trains only the adapter, and the checkpoint holds it in peft's layout", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sft-lora-"));
  try {
    const w = new SFTWorker(tinySftConfig(["trainer.device=cpu", "data.micro_batch_size_per_gpu=4", "model.lora_rank=4", "model.lora_alpha=8", "model.target_modules=[q_proj,v_proj]"]));
    const info = await w.initModel(5);
    const model = w.model!;
    assert.ok(model.lora, "an adapter is attached");
    const trainable = [...model.trainableParams().keys()];
    assert.ok(trainable.length > 0 && trainable.every((k) => /lora/i.test(k)), `only adapter weights train: ${trainable.join(", ")}`);
    assert.equal(info.numParams, model.trainableVariables().reduce((a, v) => a + v.size, 0));
    const base = new Map([...model.params].filter(([k]) => !/lora/i.test(k)).map(([k, v]) => [k, Float32Array.from(v.dataSync())]));
    const r = await w.trainStep(toyBatch([[3, 4], [12, 30], [7, 58], [41, 9]]));
    assert.ok(Number.isFinite(r.loss) && r.gradNorm > 0);
    for (const [k, v] of base) assert.deepEqual(Float32Array.from(model.params.get(k)!.dataSync()), v, `${k} stays frozen`);
    await w.saveCheckpoint(dir);
    const adapter = JSON.parse(readFileSync(join(dir, "lora_adapter", "adapter_config.json"), "utf8")) as { r: number; lora_alpha: number; target_modules: string[] };
    assert.equal(adapter.r, 4);
    assert.equal(adapter.lora_alpha, 8);
    assert.deepEqual([...adapter.target_modules].sort(), ["q_proj", "v_proj"]);
    assert.ok(existsSync(join(dir, "lora_adapter", "adapter_model.safetensors")));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("LoRA for SFT: a peft folder's lora_dropout applies in training steps only (peft trains a loaded adapter with it), seeded, and its stream is checkpointed", async () => {
  const dir = mkdtempSync(join(tmpdir(), "sft-lora-drop-"));
  try {
    const lora = ["trainer.device=cpu", "data.micro_batch_size_per_gpu=4"];
    const src = new SFTWorker(tinySftConfig([...lora, "model.lora_rank=4", "model.lora_alpha=8"]));
    await src.initModel(5);
    let s = 3;
    for (const m of src.model!.lora!.modules.values()) m.b.assign(tf.randomNormal(m.b.shape, 0, 0.3, "float32", s++));
    await saveLoraAdapter(src.model!.lora!, join(dir, "plain"));
    cpSync(join(dir, "plain"), join(dir, "drop"), { recursive: true });
    const cfgPath = join(dir, "drop", "adapter_config.json");
    writeFileSync(cfgPath, JSON.stringify({ ...JSON.parse(readFileSync(cfgPath, "utf8")), lora_dropout: 0.3 }));
    const worker = async (name: string) => {
      const w = new SFTWorker(tinySftConfig([...lora, `+model.lora_adapter_path=${join(dir, name)}`]));
      await w.initModel(5);
      return w;
    };
    const plain = await worker("plain"), drop = await worker("drop"), twin = await worker("drop");
    assert.equal(drop.model!.lora!.dropout?.p, 0.3);
    const batch = toyBatch([[3, 4], [12, 30], [7, 58], [41, 9]]);
    const ep = await plain.evalLoss(batch), ed = await drop.evalLoss(batch);
    assert.equal(ed.lossSum, ep.lossSum, "evaluation runs without dropout");
    const tp = await plain.trainStep(batch), td = await drop.trainStep(batch), tt = await twin.trainStep(batch);
    assert.notEqual(td.loss, tp.loss, "the training step drops adapter units");
    assert.equal(tt.loss, td.loss, "same seed, same step");
    await drop.saveCheckpoint(join(dir, "ckpt"));
    const extra = readdirSync(join(dir, "ckpt")).find((f) => f.startsWith("extra_state"));
    assert.ok(extra && JSON.parse(readFileSync(join(dir, "ckpt", extra), "utf8")).rng.lora_dropout, "the dropout stream resumes");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
