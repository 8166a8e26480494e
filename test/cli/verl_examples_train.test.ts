// verl's own smallest GSM8K example scripts train end to end: the override list each script passes to
// verl.trainer.main_ppo (captured in test/config/fixtures/verl_examples.json) goes to `verl train` with
// only the model path, the data paths and the sizes substituted, and 2 steps of metrics come out.
// Every other override (use_remove_padding, fsdp_config.*, rollout.name=vllm, gpu_memory_utilization,
// megatron.*, ...) is passed exactly as the script writes it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { packageRoot, sharedPath } from "../../src/utils/paths.js";
import { makeMultiTurnSftData } from "./verl_examples_sft_data.js";

/** The compiled CLI beside this compiled test (what bin/verl.js runs). */
const MAIN = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));

/** The scripts run: the GSM8K GRPO and PPO examples with the fewest overrides (FSDP and Megatron layouts). */
const SCRIPTS = [
  "examples/grpo_trainer/run_qwen2-7b.sh",
  "examples/ppo_trainer/run_gemma.sh",
  "examples/ppo_trainer/run_deepseek_math_gsm8k_megatron.sh",
] as const;

const MODEL = sharedPath("models", "stories260K", "stories260K.bin");
const GSM8K_RAW = sharedPath("data", "gsm8k", "train.jsonl") && sharedPath("data", "gsm8k");
const skip = MODEL && GSM8K_RAW ? false : "../shared/models/stories260K or ../shared/data/gsm8k is absent";

interface Entry { script: string; trainer: string; configName: string | null; overrides: string[] }

const entries = (JSON.parse(readFileSync(join(packageRoot, "test/config/fixtures/verl_examples.json"), "utf8")) as { entries: Entry[] }).entries;

/** Tiny sizes: a stories260K model on 2 CPU cores, a few seconds a step. */
const SIZES: Record<string, string> = {
  "data.train_batch_size": "2",
  "data.max_prompt_length": "256",
  "data.max_response_length": "8",
  "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "2",
  "actor_rollout_ref.rollout.n": "2",
  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "2",
  "critic.ppo_micro_batch_size_per_gpu": "2",
  "trainer.n_gpus_per_node": "1",
};
/** Sizes the scripts leave at verl's defaults, set here to keep the run to 2 short steps. */
const ADDED_SIZES = ["trainer.total_training_steps=2", "data.train_max_samples=8", "data.val_max_samples=4"];

/** `verl preprocess gsm8k`: verl's layout of GSM8K from the raw train/test JSON lines. Its flags live here only. */
function preprocessGsm8k(rawDir: string, outDir: string): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [MAIN, "preprocess", "gsm8k", "--local_dataset_path", rawDir, "--local_save_dir", outDir], { encoding: "utf8", timeout: 60_000 }, (err, _out, stderr) => {
      if (err) reject(new Error(`verl preprocess gsm8k failed: ${stderr}`));
      else resolve();
    });
  });
}

/** The script's overrides in its order, the keys of `substitute` given its values. */
function substituted(e: Entry, substitute: Record<string, string>): string[] {
  return e.overrides.map((o) => {
    const key = o.slice(0, o.indexOf("="));
    return key in substitute ? `${key}=${substitute[key]}` : o;
  });
}

/** The console logger's lines, `step:N - key:value - ...`, as one record per step (lines of one step merged: SFT logs val/loss apart). */
function consoleSteps(stdout: string): Map<number, Record<string, number>> {
  const steps = new Map<number, Record<string, number>>();
  for (const line of stdout.split("\n")) {
    const m = /^step:(\d+) - (.*)$/.exec(line);
    if (!m) continue;
    const rec: Record<string, number> = steps.get(Number(m[1])) ?? {};
    for (const kv of m[2]!.split(" - ")) {
      const i = kv.lastIndexOf(":");
      rec[kv.slice(0, i)] = Number(kv.slice(i + 1));
    }
    steps.set(Number(m[1]), rec);
  }
  return steps;
}

// The runs side by side: each waits on worker threads and start-up more than on the CPU.
describe("verl's GSM8K example scripts train 2 steps unchanged but for model, data and sizes", { skip, concurrency: 3 }, () => {
  let dir = "";
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "verl-examples-"));
    await preprocessGsm8k(GSM8K_RAW!, join(dir, "gsm8k"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  for (const script of SCRIPTS) {
    test(script, async () => {
      const e = entries.find((x) => x.script === script);
      assert.ok(e, `${script} is not in the fixture`);
      const train = join(dir, "gsm8k", "train.parquet"), val = join(dir, "gsm8k", "test.parquet");
      const substitute: Record<string, string> = {
        "data.train_files": train,
        "data.val_files": val,
        "actor_rollout_ref.model.path": MODEL!,
        "critic.model.path": MODEL!,
        ...SIZES,
      };
      const overrides = substituted(e, substitute);
      const changed = e.overrides.filter((o, i) => o !== overrides[i]).map((o) => o.slice(0, o.indexOf("=")));
      for (const k of ["data.train_files", "data.val_files", "actor_rollout_ref.model.path"]) assert.ok(changed.includes(k), `the script sets no ${k} to substitute`);
      const args = ["train", ...(e.configName ? ["--config-name", e.configName] : []), ...overrides, ...ADDED_SIZES];
      // cwd: a fresh folder, so the script's relative trainer.default_local_dir lands there and nothing resumes
      const cwd = mkdtempSync(join(dir, "run-"));
      const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
        execFile(process.execPath, [MAIN, ...args], { cwd, encoding: "utf8", maxBuffer: 64 << 20, timeout: 120_000 }, (err, stdout, stderr) => {
          resolve({ code: err ? (typeof err.code === "number" ? err.code : null) : 0, stdout, stderr });
        });
      });
      assert.equal(r.code, 0, `verl ${args.join(" ")}\n${r.stderr.slice(-3000)}`);
      const steps = consoleSteps(r.stdout);
      // step 0: validation before training (verl's val_before_train default); then the 2 training steps
      assert.deepEqual([...steps.keys()], [0, 1, 2], `steps logged: ${[...steps.keys()].join(", ")}`);
      assert.ok(Number.isFinite(steps.get(0)!["val-core/openai/gsm8k/reward/mean@1"]), "no validation score at step 0");
      const ppo = e.overrides.includes("algorithm.adv_estimator=gae");
      for (const n of [1, 2]) {
        const m = steps.get(n)!;
        assert.equal(m["training/global_step"], n);
        for (const k of ["actor/pg_loss", "critic/score/mean", "response_length/mean", ...(ppo ? ["critic/vf_loss"] : ["actor/kl_loss"])]) {
          assert.ok(Number.isFinite(m[k]), `step ${n}: ${k} is ${m[k]}`);
        }
      }
      // the script's inert plumbing (vLLM memory, FSDP offload, ...) is named in the one start-up warning
      assert.match(r.stderr, /setting\(s\) have no effect in verl-ts[\s\S]*gpu_memory_utilization/);
    });
  }
});

// ---- issue 24, algorithm and SFT rows: rollout correction's bypass mode, the optimal token
// baseline, SFT with LoRA, multi-turn SFT and verl's engine SFT trainer (verl.trainer.sft_trainer),
// each run as its script writes it but for paths and sizes, with its metrics under verl's names.

/** verl's tests/special_e2e/sft/run_sft_engine.sh at the fixture's commit (its defaults: fsdp backend,
 *  spmd mode, so `torchrun ... -m verl.trainer.sft_trainer` = `verl sft --config-name sft_trainer_engine`). */
const SFT_ENGINE_SCRIPT: Entry = {
  script: "tests/special_e2e/sft/run_sft_engine.sh", trainer: "sft_engine", configName: "sft_trainer_engine",
  overrides: [
    "data.train_files=/home/user/data/gsm8k_sft/train.parquet", "data.val_files=/home/user/data/gsm8k_sft/test.parquet",
    "data.train_batch_size=128", "data.pad_mode=no_padding", "data.truncation=error", "data.use_dynamic_bsz=True",
    "data.max_token_len_per_gpu=2048", "data.messages_key=messages", "model.path=/home/user/models/Qwen/Qwen2.5-0.5B",
    "model.use_remove_padding=True", "engine=fsdp", "optim=fsdp", "optim.lr=1e-5", "optim.lr_warmup_steps_ratio=0.2",
    "optim.weight_decay=0.1", "optim.betas=[0.9,0.95]", "optim.clip_grad=1.0", "optim.min_lr_ratio=0.1",
    "optim.lr_scheduler_type=cosine", "engine.ulysses_sequence_parallel_size=1", "engine.strategy=fsdp", "engine.fsdp_size=1",
    "trainer.test_freq=after_each_epoch", "trainer.save_freq=-1", "trainer.logger=['console','file']",
    "trainer.project_name=verl_sft_test", "trainer.experiment_name=gsm8k-fsdp-fsdp-sp1-fsdp1-pad-no_padding-use_remove_padding-True-mode-spmd",
    "trainer.total_epochs=2", "trainer.total_training_steps=2", "trainer.default_local_dir=/home/user/verl/test/gsm8k-sft-fsdp",
    "trainer.resume_mode=disable",
  ],
};

interface Case24 {
  script: string;
  /** `verl` subcommand. */
  command: "train" | "sft";
  /** Keys to substitute (paths and sizes) -> value, given the prepared data. */
  substitute: (d: Data24) => Record<string, string>;
  /** Keys the script leaves at verl's defaults, set to keep the run to 2 short steps. */
  added: string[];
  /** Metrics every training step must carry (verl's names). */
  metrics: string[];
  /** Metrics that must not appear (the other SFT trainer's names). */
  absent?: string[];
  /** Files the run must leave under its working folder. */
  files?: string[];
}

interface Data24 { gsm8kTrain: string; gsm8kTest: string; mtModel: string; mtTrain: string; mtTest: string; moeModel: string }

/** verl's router-replay examples on the Qwen3-MoE fixture (256 positions: GSM8K prompts over 240 tokens are filtered out). */
function routerReplayCase(script: string): Case24 {
  return {
    script, command: "train",
    substitute: (d) => ({
      "data.train_files": d.gsm8kTrain, "data.val_files": d.gsm8kTest, "actor_rollout_ref.model.path": d.moeModel, ...SIZES,
      "data.max_prompt_length": "240", "trainer.nnodes": "1", "trainer.total_training_steps": "2",
    }),
    added: ["data.train_max_samples=16", "data.val_max_samples=16"],
    metrics: ["actor/pg_loss", "actor/grad_norm", "actor/router_aux_loss", "actor/entropy"],
  };
}

const SFT_SIZES = { "data.train_batch_size": "4", "data.micro_batch_size_per_gpu": "4", "data.micro_batch_size": "4" };
const LEGACY_SFT_METRICS = ["train/loss", "train/lr(1e-3)", "train/time(s)"];

const CASES_24: Case24[] = [
  {
    script: "examples/rollout_correction/run_with_rollout_corr.sh", command: "train",
    substitute: (d) => ({ "data.train_files": d.gsm8kTrain, "data.val_files": d.gsm8kTest, "actor_rollout_ref.model.path": MODEL!, ...SIZES, "actor_rollout_ref.actor.ppo_mini_batch_size": "1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "1" }),
    added: ADDED_SIZES,
    // bypass mode: the actor's loss reports the correction against the current policy
    metrics: ["actor/pg_loss", "actor/ppo_kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_batch_norm_factor", "rollout_corr/kl", "rollout_corr/training_ppl"],
  },
  {
    script: "examples/otb_trainer/run_qwen2_5-7b.sh", command: "train",
    substitute: (d) => ({ "data.train_files": d.gsm8kTrain, "data.val_files": d.gsm8kTest, "actor_rollout_ref.model.path": MODEL!, ...SIZES }),
    added: ADDED_SIZES,
    metrics: ["actor/pg_loss", "critic/advantages/mean", "variance_proxy/proxy2_total_power", "variance_proxy/expected_w", "variance_proxy/proxy3_pure_noise"],
  },
  {
    script: "examples/sft/gsm8k/run_qwen_05_peft.sh", command: "sft",
    substitute: (d) => ({ "data.train_files": d.gsm8kTrain, "data.val_files": d.gsm8kTest, "model.partial_pretrain": MODEL!, ...SFT_SIZES, "trainer.default_local_dir": "ckpt" }),
    added: ["trainer.total_training_steps=2", "data.train_batch_size=4", "data.train_max_samples=16", "data.val_max_samples=4", "data.max_length=256", "data.truncation=right"],
    metrics: LEGACY_SFT_METRICS, absent: ["train/lr", "train/grad_norm"],
    // LoRA: the adapter in peft's layout beside the merged Hugging Face export
    files: ["ckpt/global_step_2/lora_adapter/adapter_config.json", "ckpt/global_step_2/huggingface/model.safetensors"],
  },
  {
    script: "examples/sft/multiturn/run_qwen_05_sp2.sh", command: "sft",
    substitute: (d) => ({ "data.train_files": d.mtTrain, "data.val_files": d.mtTest, "model.partial_pretrain": d.mtModel, ...SFT_SIZES, "trainer.default_local_dir": "ckpt", "trainer.total_training_steps": "2" }),
    added: ["data.train_batch_size=4", "data.max_length=256"],
    metrics: LEGACY_SFT_METRICS, absent: ["train/lr"],
  },
  {
    script: SFT_ENGINE_SCRIPT.script, command: "sft",
    substitute: (d) => ({ "data.train_files": d.mtTrain, "data.val_files": d.mtTest, "model.path": d.mtModel, "data.train_batch_size": "4", "data.max_token_len_per_gpu": "512", "trainer.default_local_dir": "ckpt" }),
    added: ["data.max_length=256"],
    metrics: ["train/loss", "train/grad_norm", "train/lr", "train/mfu", "train/global_tokens", "train/total_tokens(B)"], absent: ["train/lr(1e-3)"],
  },
  // MoE routing replay: R2 (rollout.name=vllm) and R3 with the rollout's record (rollout.name=sglang)
  routerReplayCase("examples/router_replay/run_qwen30_a3b_megatron_vllm.sh"),
  routerReplayCase("examples/router_replay/run_qwen30_a3b_megatron_sglang.sh"),
];

describe("issue 24: verl's rollout-correction, OTB, SFT and router-replay example scripts run 2 steps unchanged but for paths and sizes", { skip, concurrency: 2 }, () => {
  let dir = "";
  let data: Data24;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "verl-examples-24-"));
    await preprocessGsm8k(GSM8K_RAW!, join(dir, "gsm8k"));
    const mt = await makeMultiTurnSftData(dir);
    // the committed Qwen3-MoE fixture, with a plain chat template (it has none)
    const moeModel = join(dir, "qwen3_moe");
    cpSync(join(packageRoot, "test/models/fixtures/families/qwen3_moe"), moeModel, { recursive: true });
    writeFileSync(join(moeModel, "chat_template.jinja"), "{% for m in messages %}{{ m['content'] }}{% endfor %}");
    data = { gsm8kTrain: join(dir, "gsm8k", "train.parquet"), gsm8kTest: join(dir, "gsm8k", "test.parquet"), mtModel: mt.model, mtTrain: mt.train, mtTest: mt.test, moeModel };
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  for (const c of CASES_24) {
    test(c.script, async () => {
      const e = c.script === SFT_ENGINE_SCRIPT.script ? SFT_ENGINE_SCRIPT : entries.find((x) => x.script === c.script);
      assert.ok(e, `${c.script} is not in the fixture`);
      const substitute = c.substitute(data);
      const overrides = substituted(e, substitute);
      const changed = e.overrides.filter((o, i) => o !== overrides[i]).map((o) => o.slice(0, o.indexOf("=")));
      for (const k of ["data.train_files", "data.val_files"]) assert.ok(changed.includes(k), `the script sets no ${k} to substitute`);
      const args = [c.command, ...(e.configName ? ["--config-name", e.configName] : []), ...overrides, ...c.added];
      const cwd = mkdtempSync(join(dir, "run-"));
      const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
        execFile(process.execPath, [MAIN, ...args], { cwd, encoding: "utf8", maxBuffer: 64 << 20, timeout: 120_000, env: { ...process.env, VERL_FILE_LOGGER_PATH: join(cwd, "metrics.jsonl") } }, (err, stdout, stderr) => {
          resolve({ code: err ? (typeof err.code === "number" ? err.code : null) : 0, stdout, stderr });
        });
      });
      assert.equal(r.code, 0, `verl ${args.join(" ")}\n${r.stderr.slice(-3000)}`);
      const steps = consoleSteps(r.stdout);
      for (const n of [1, 2]) {
        const m = steps.get(n);
        assert.ok(m, `step ${n} not logged: ${[...steps.keys()].join(", ")}`);
        for (const k of c.metrics) assert.ok(Number.isFinite(m[k]), `step ${n}: ${k} is ${m[k]}`);
        for (const k of c.absent ?? []) assert.ok(!(k in m), `step ${n} logs ${k}, a name this trainer of verl's does not use`);
      }
      if (c.command === "sft") assert.ok(Number.isFinite(steps.get(2)!["val/loss"]), "val/loss at the last step");
      for (const f of c.files ?? []) assert.ok(existsSync(join(cwd, f)), `${f} was not written`);
    });
  }
});

// ---------------------------------------------------------------------------------------------------
// verl's multi-turn examples (examples/sglang_multiturn/): agent loops with the calc_gsm8k_reward tool
// or the GSM8K simulated user, run with rollout.name as each script writes it (sglang or vllm: the
// host decoder's continuous-batching server on a CPU rank). The model is a tiny Qwen2 folder (2 layers,
// the tok512 tokenizer with a ChatML-with-tools template): the templated prompts (~1000 tokens) do not
// fit stories260K's 512 positions. The scripts' --config-path is their config folder, written below with
// the keys verl's files set; only its location is substituted.
import { mkdirSync } from "node:fs";
import { initBackend } from "../../src/engine/backend.js";
import { initModel, makeConfig } from "../../src/models/index.js";
import { saveHfModel } from "../../src/models/hf.js";
import { Llama2cTokenizer } from "../../src/models/tokenizers/llama2c.js";
import { saveLlama2cAsHf } from "../../src/models/tokenizers/llama2c_export.js";
import { Rng } from "../../src/utils/rng.js";

const MULTITURN_SCRIPTS = [
  "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh",
  "examples/sglang_multiturn/run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh",
  "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh",
  "examples/sglang_multiturn/run_qwen2.5-3b_megatron_gsm8k_multiturn.sh",
] as const;
const TOK512 = sharedPath("models", "stories260K", "tok512.bin");
const multiturnSkip = TOK512 && GSM8K_RAW ? false : "../shared/models/stories260K/tok512.bin or ../shared/data/gsm8k is absent";
const CAPTURED_CONFIG_PATH = "/tmp/verlsrc/examples/sglang_multiturn/config";

/** The example config folder: the root configs the scripts name and the tool / interaction files. */
function writeMultiturnConfigs(dir: string): void {
  mkdirSync(join(dir, "tool_config"), { recursive: true });
  mkdirSync(join(dir, "interaction_config"), { recursive: true });
  const root = (base: string, turns: string) => `hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ${base}\n  - _self_\n` +
    `data:\n  max_prompt_length: 1024\n  max_response_length: 1024\n  train_batch_size: 256\n  return_raw_chat: True\n` +
    `actor_rollout_ref:\n  hybrid_engine: True\n  rollout:\n    name: sglang\n    multi_turn:\n      enable: True\n      ${turns}: 5\n`;
  writeFileSync(join(dir, "gsm8k_multiturn_grpo.yaml"), root("ppo_trainer", "max_assistant_turns"));
  writeFileSync(join(dir, "gsm8k_multiturn_grpo_w_interaction.yaml"), root("ppo_trainer", "max_user_turns"));
  writeFileSync(join(dir, "gsm8k_multiturn_megatron_grpo.yaml"), root("ppo_megatron_trainer", "max_assistant_turns"));
  writeFileSync(join(dir, "tool_config", "gsm8k_tool_config.yaml"), `tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed answer is incorrect or not correctly parsed)"
        parameters: {type: object, properties: {answer: {type: string, description: "The model's answer to the GSM8K math problem, must be a digits"}}, required: [answer]}
`);
  writeFileSync(join(dir, "interaction_config", "gsm8k_interaction_config.yaml"), `interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n`);
}

/** A 2-layer Qwen2 folder (q/k/v biases, tied head, 2048 positions) with the tok512 tokenizer and a tools chat template. */
async function tinyQwen2(dir: string): Promise<void> {
  await initBackend("cpu");
  const template = readFileSync(join(packageRoot, "recipes/gsm8k_multiturn/config/chatml_tools.jinja"), "utf8");
  const model = initModel(makeConfig({ vocabSize: 512, dim: 32, hiddenDim: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, maxSeqLen: 2048, attentionBias: true, tieWordEmbeddings: true }), new Rng(1));
  try {
    await saveHfModel(model, dir);
  } finally {
    model.dispose();
  }
  saveLlama2cAsHf(Llama2cTokenizer.fromFile(TOK512!, template), dir, template);
}

function run(args: string[], cwd: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [MAIN, ...args], { cwd, encoding: "utf8", maxBuffer: 64 << 20, timeout: 180_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : null) : 0, stdout, stderr });
    });
  });
}

describe("verl's multi-turn example scripts train 2 steps with rollout.name as written", { skip: multiturnSkip, concurrency: 2 }, () => {
  let dir = "";
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "verl-multiturn-"));
    writeMultiturnConfigs(join(dir, "config"));
    await tinyQwen2(join(dir, "qwen2"));
    await new Promise<void>((resolve, reject) => {
      execFile(process.execPath, [MAIN, "preprocess", "gsm8k", "--agent", "--local_dataset_path", GSM8K_RAW!, "--local_save_dir", join(dir, "gsm8k_tool")], { encoding: "utf8", timeout: 60_000 }, (err, _out, stderr) => (err ? reject(new Error(stderr)) : resolve()));
    });
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  for (const script of MULTITURN_SCRIPTS) {
    test(script, async () => {
      const e = entries.find((x) => x.script === script);
      assert.ok(e, `${script} is not in the fixture`);
      const substitute: Record<string, string> = {
        "data.train_files": join(dir, "gsm8k_tool", "train.parquet"),
        "data.val_files": join(dir, "gsm8k_tool", "test.parquet"),
        "actor_rollout_ref.model.path": join(dir, "qwen2"),
        ...SIZES,
        // the templated prompts with the tool schema are ~1000 tok512 tokens
        "data.max_prompt_length": "1152",
        "data.max_response_length": "32",
        // `use_kl_loss=${use_kl_loss}`: a variable the vllm_fsdp script expects from the user's environment
        "actor_rollout_ref.actor.use_kl_loss": "True",
      };
      const overrides = substituted(e, substitute).map((o) => o.replace(CAPTURED_CONFIG_PATH, join(dir, "config")));
      const rolloutName = e.overrides.find((o) => o.startsWith("actor_rollout_ref.rollout.name="));
      assert.ok(rolloutName && /=(sglang|vllm)$/.test(rolloutName), `${script} names no inference engine`);
      assert.ok(overrides.includes(rolloutName), "rollout.name passed as written");
      const args = ["train", "--config-path", join(dir, "config"), "--config-name", e.configName!, ...overrides, ...ADDED_SIZES];
      const r = await run(args, mkdtempSync(join(dir, "run-")));
      assert.equal(r.code, 0, `verl ${args.join(" ")}\n${r.stderr.slice(-3000)}`);
      const steps = consoleSteps(r.stdout);
      assert.deepEqual([...steps.keys()], [0, 1, 2], `steps logged: ${[...steps.keys()].join(", ")}`);
      const overSample = e.overrides.includes("actor_rollout_ref.rollout.over_sample_rate=0.1");
      for (const n of [1, 2]) {
        const m = steps.get(n)!;
        for (const k of ["actor/pg_loss", "actor/kl_loss", "critic/score/mean", "response_length/mean", "num_turns/mean", "num_turns/max", "response/aborted_ratio"]) {
          assert.ok(Number.isFinite(m[k]), `step ${n}: ${k} is ${m[k]}`);
        }
        if (!overSample) assert.ok(m["num_turns/min"]! >= 2, "every conversation has an assistant turn");
        // over_sample_rate=0.1 on 4 requests: int(4 * 0.9) = 3 finish, the 4th is aborted (an empty response)
        assert.equal(m["response/aborted_ratio"], overSample ? 0.25 : 0, `step ${n}: response/aborted_ratio`);
      }
    });
  }
});
