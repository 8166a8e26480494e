// `verl run SCRIPT.sh`: a verl shell script runs as it is (bash expands its variables, continuations
// and "$@"); its launcher calls of verl's entry points become verl subcommands, others are refused by name.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { mapLauncherCall } from "../../src/cli/entry_points.js";

const MAIN = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));

function verl(args: string[], cwd: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [MAIN, ...args], { cwd, encoding: "utf8", timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, stdout, stderr });
    });
  });
}

test("verl's entry points map to subcommands and config names", () => {
  assert.deepEqual(mapLauncherCall("python3", ["-m", "verl.trainer.main_ppo", "--config-path=cfg", "--config-name=x", "a.b=1"]).argv, ["train", "--config-path", "cfg", "--config-name", "x", "a.b=1"]);
  assert.deepEqual(mapLauncherCall("python3", ["-u", "-m", "verl.trainer.fsdp_sft_trainer", "-cn", "sft_trainer", "a=1"]).argv, ["sft", "--config-name", "sft_trainer", "a=1"]);
  assert.deepEqual(mapLauncherCall("python", ["-m", "verl.trainer.sft_trainer", "a=1"]).argv, ["sft", "--config-name", "sft_trainer_engine", "a=1"]);
  assert.deepEqual(mapLauncherCall("torchrun", ["--nproc_per_node", "4", "-m", "verl.trainer.fsdp_sft_trainer", "a=1"]).argv, ["sft", "a=1", "trainer.n_gpus_per_node=4"]);
  assert.deepEqual(mapLauncherCall("python3", ["-m", "verl.trainer.main_generation", "data.path=p"]).argv, ["generate", "data.path=p"]);
  assert.deepEqual(mapLauncherCall("python3", ["-m", "verl.trainer.main_eval"]).argv, ["eval"]);
  assert.throws(() => mapLauncherCall("python3", ["-m", "recipe.dapo.main_dapo", "a=1"]), /recipe\.dapo\.main_dapo is not a verl entry point verl-ts maps/);
  assert.throws(() => mapLauncherCall("python3", ["-m", "verl.trainer.main_generation_server"]), /generation server .* not built/);
  assert.throws(() => mapLauncherCall("python3", ["train.py"]), /`python3 train.py` runs no verl module/);
});

test("verl run: the script's variables, continuations and \"$@\" reach the config; substitutions are printed; others refused", async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-run-test-"));
  try {
    writeFileSync(join(dir, "run_grpo.sh"), [
      "set -x", "N=3", "export VLLM_USE_V1=1", "pip install -U something",
      "python3 -m verl.trainer.main_ppo \\", "    algorithm.adv_estimator=grpo \\", "    actor_rollout_ref.rollout.n=$N \\", "    \"$@\"", "",
    ].join("\n"));
    const ok = await verl(["run", "run_grpo.sh", "trainer.experiment_name=from_args", "--cfg", "job"], dir);
    assert.equal(ok.code, 0, ok.stderr);
    assert.match(ok.stdout, /adv_estimator: grpo/);
    assert.match(ok.stdout, /^ {4}n: 3$/m);
    assert.match(ok.stdout, /experiment_name: from_args/);
    assert.match(ok.stderr, /verl run: `python3 -m verl\.trainer\.main_ppo` -> `verl train`/);
    assert.match(ok.stderr, /verl run: skipped `pip install -U something`/);

    writeFileSync(join(dir, "dapo.sh"), "python3 -m recipe.dapo.main_dapo a=1\necho done\n");
    const bad = await verl(["run", "dapo.sh"], dir);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /error: verl run: dapo\.sh: `python3 -m recipe\.dapo\.main_dapo`: recipe\.dapo\.main_dapo is not a verl entry point/);

    writeFileSync(join(dir, "none.sh"), "echo nothing\n");
    const none = await verl(["run", "none.sh"], dir);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /none\.sh called no verl entry point/);

    writeFileSync(join(dir, "badcfg.sh"), "python3 -m verl.trainer.main_ppo no.such.key=1\n");
    const failed = await verl(["run", "badcfg.sh"], dir);
    assert.notEqual(failed.code, 0);
    assert.match(failed.stderr, /no\.such\.key/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
