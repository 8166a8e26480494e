// The CLI as a user runs it: a child process on the compiled main.js beside this
// compiled test (dist/ or dist-<name>/ alike).
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";

const MAIN = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));
const BIN = fileURLToPath(new URL("../../../bin/verl.js", import.meta.url));

interface Run { code: number | null; stdout: string; stderr: string }

function run(script: string, args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    execFile(process.execPath, [script, ...args], { encoding: "utf8", env: { ...process.env, CI: "1" }, timeout: 60_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === "number" ? err.code : null) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}
const verl = (...args: string[]) => run(MAIN, args);

// Each case spawns node; run them side by side.
describe("verl CLI", { concurrency: 4 }, () => {
  test("--cfg job prints the merged tree with the overrides and exits 0", async () => {
    const r = await verl("train", "algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "--cfg", "job");
    assert.equal(r.code, 0, r.stderr);
    const cfg = parse(r.stdout);
    assert.equal(cfg.algorithm.adv_estimator, "grpo");
    assert.equal(cfg.data.train_batch_size, 8);
    assert.equal(cfg.actor_rollout_ref.actor.ppo_mini_batch_size, 4);
    assert.equal(cfg.critic.ppo_mini_batch_size, 4, "interpolations resolved after the overrides");
    assert.equal(r.stdout.includes("${"), false);
    assert.equal(r.stderr, "");
  });

  test("an unknown key exits 2 naming it", async () => {
    const r = await verl("train", "trainer.no_such_key=1");
    assert.equal(r.code, 2);
    assert.match(r.stderr, /^error: could not override 'trainer\.no_such_key'/);
    assert.equal(r.stdout, "");
    const typo = await verl("train", "actor.optim.lr=1e-5", "--cfg", "job");
    assert.equal(typo.code, 2);
    assert.match(typo.stderr, /did you mean actor_rollout_ref\.actor\.optim\.lr\?/);
  });

  test("a type mismatch, a bad override, a stray option and a bad --cfg exit 2", async () => {
    const [mismatch, noValue, stray, cfgWhat] = await Promise.all([
      verl("train", "data.train_batch_size=many"),
      verl("train", "data.train_batch_size"),
      verl("sft", "--no-such-flag", "--cfg", "job"),
      verl("train", "--cfg", "hydra"),
    ]);
    assert.equal(mismatch.code, 2);
    assert.match(mismatch.stderr, /data\.train_batch_size.*expected a number/);
    assert.equal(noValue.code, 2);
    assert.match(noValue.stderr, /has no '='/);
    assert.equal(stray.code, 2);
    assert.match(stray.stderr, /unknown option '--no-such-flag'/);
    assert.equal(cfgWhat.code, 2);
    assert.match(cfgWhat.stderr, /--cfg hydra: only 'job'/);
  });

  test("every example in a command's --help runs and exits 0", async () => {
    for (const cmd of ["train", "sft", "generate", "eval"]) {
      const help = await verl(cmd, "--help");
      assert.equal(help.code, 0, help.stderr);
      const examples = help.stdout.split("\n").filter((l) => l.startsWith(`  verl ${cmd} `)).map((l) => l.trim().split(/\s+/).slice(1));
      assert.equal(examples.length, 2, help.stdout);
      for (const args of examples) {
        const r = await verl(...args);
        assert.equal(r.code, 0, `verl ${args.join(" ")}: ${r.stderr}`);
      }
    }
  });

  test("an override with an unbalanced quote exits 2 naming it", async () => {
    const r = await verl("train", "trainer.experiment_name='my run", "--cfg", "job");
    assert.equal(r.code, 2);
    assert.match(r.stderr, /^error: override 'trainer\.experiment_name='my run': unbalanced quote/);
  });

  test("train checks the batch arithmetic before running anything", async () => {
    const r = await verl("train", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4");
    assert.equal(r.code, 2);
    assert.match(r.stderr, /^error: invalid PPO config:/);
    assert.match(r.stderr, /data\.train_batch_size \(2\) must be >= actor_rollout_ref\.actor\.ppo_mini_batch_size \(4\)/);
  });

  test("each subcommand composes its own root config", async () => {
    for (const [cmd, key] of [["sft", "optim.lr_scheduler"], ["generate", "data.n_samples"], ["eval", "data.response_key"]] as const) {
      const r = await verl(cmd, "--cfg", "job");
      assert.equal(r.code, 0, `${cmd}: ${r.stderr}`);
      const cfg = parse(r.stdout);
      assert.notEqual(key.split(".").reduce((n, k) => n?.[k], cfg), undefined, `${cmd} has ${key}`);
    }
  });

  test("--config-path / --config-name (and Hydra's -cp / -cn) pick a recipe", async () => {
    const dir = mkdtempSync(join(tmpdir(), "verl-cli-test-"));
    writeFileSync(join(dir, "recipe.yaml"), "defaults: [ppo_trainer, _self_]\ntrainer:\n  project_name: from_recipe\n");
    for (const args of [[`--config-path=${dir}`, "--config-name=recipe"], ["-cp", dir, "-cn", "recipe"]]) {
      const r = await verl("train", ...args, "trainer.total_epochs=2", "--cfg", "job");
      assert.equal(r.code, 0, r.stderr);
      const cfg = parse(r.stdout);
      assert.equal(cfg.trainer.project_name, "from_recipe");
      assert.equal(cfg.trainer.total_epochs, 2);
      assert.equal(cfg.trainer.default_local_dir, "checkpoints/from_recipe/gsm8k");
    }
    const missing = await verl("train", "--config-name", "nope", "--cfg", "job");
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /cannot find config 'nope'/);
  });

  test("--help describes each subcommand and exits 0", async () => {
    const [top, train, pre] = await Promise.all([verl("--help"), verl("train", "--help"), verl("preprocess", "--help")]);
    assert.equal(top.code, 0);
    for (const c of ["train", "sft", "generate", "eval", "preprocess", "plot"]) assert.match(top.stdout, new RegExp(`\\b${c}\\b`));
    assert.equal(train.code, 0);
    assert.match(train.stdout, /overrides/);
    assert.match(train.stdout, /--cfg/);
    assert.match(train.stdout, /--config-path/);
    assert.match(pre.stdout, /--num-train/);
  });

  test("trainer.log_level must be a pino level", async () => {
    const r = await verl("train", "trainer.log_level=loud", "--cfg", "job");
    assert.equal(r.code, 2);
    assert.match(r.stderr, /trainer\.log_level is "loud"/);
  });

  test("preprocess hands its options to the data layer's preprocessor", async () => {
    const out = mkdtempSync(join(tmpdir(), "verl-preprocess-test-"));
    const [ok, unknown, badCount] = await Promise.all([
      verl("preprocess", "arithmetic", "--local_save_dir", out, "--num-train", "4", "--num-test", "2", "--seed", "3"),
      verl("preprocess", "no_such_dataset"),
      verl("preprocess", "arithmetic", "--num-train", "x"),
    ]);
    assert.equal(ok.code, 0, ok.stderr);
    assert.ok(existsSync(join(out, "train.parquet")) && existsSync(join(out, "test.parquet")));
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /^error: .*'no_such_dataset'.*arithmetic/);
    assert.equal(badCount.code, 1);
    assert.match(badCount.stderr, /--num-train.*'x' is invalid/);
  });

  test("bin/verl.js asks for a build when dist/ is missing", async () => {
    const dir = mkdtempSync(join(tmpdir(), "verl-bin-test-"));
    mkdirSync(join(dir, "bin"));
    copyFileSync(BIN, join(dir, "bin", "verl.js"));
    writeFileSync(join(dir, "package.json"), '{"type":"module"}');
    const r = await run(join(dir, "bin", "verl.js"), ["--help"]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /npm run build/);
  });
});
