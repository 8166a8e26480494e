// What `verl train` does on a fault (docs/training.md, "Faults"): a rank that stops
// answering, non-finite rewards, user reward code that never returns or ends the
// process, a kill between the checkpoint and the metrics line, and worker stack traces
// only with VERL_DEBUG=1. Each run is a tiny from-scratch model, a few seconds.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { makeWorkspace, metricsByStep, runTrain, scratchModel, type Workspace } from "./fixtures.js";

const CORE_ALGOS = new URL("../../../../src/trainer/ppo/core_algos/index.js", import.meta.url).href;
const TRACKING = new URL("../../../../src/utils/tracking.js", import.meta.url).href;

function scratch(ws: Workspace): string[] {
  return [...ws.overrides, ...scratchModel(16, 1), "trainer.logger=console", "algorithm.adv_estimator=grpo", `trainer.default_local_dir=${ws.dir}/c`];
}

function writeFile(ws: Workspace, name: string, lines: string[]): string {
  const path = join(ws.dir, name);
  writeFileSync(path, lines.join("\n"));
  return path;
}

async function inWorkspace(body: (ws: Workspace) => Promise<void>): Promise<void> {
  const ws = await makeWorkspace();
  try {
    await body(ws);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
}

test("a rank stuck in a busy loop (a custom loss) fails the step within trainer.heartbeat_timeout, naming the rank and the call", async () => {
  await inWorkspace(async (ws) => {
    const ext = writeFile(ws, "spin.mjs", [
      `import { getPolicyLoss, registerPolicyLoss } from ${JSON.stringify(CORE_ALGOS)};`,
      "const vanilla = getPolicyLoss('vanilla');",
      "registerPolicyLoss('spin_on_rank_1', (args) => { if (process.env.RANK === '1') for (;;) {} return vanilla(args); });",
    ]);
    const t0 = Date.now();
    const run = await runTrain([...scratch(ws), `actor_rollout_ref.model.external_lib=${ext}`, "trainer.n_gpus_per_node=2",
      "actor_rollout_ref.actor.policy_loss.loss_mode=spin_on_rank_1", "trainer.total_training_steps=1", "trainer.heartbeat_timeout=4"], {}, undefined, 90_000);
    assert.equal(run.signal, null, `verl train hung (killed after 90 s); stderr: ${run.stderr}`);
    assert.equal(run.code, 1, run.stderr);
    assert.match(run.stderr, /error: rank 1 stopped responding during updateActor: no progress for 4 s \(trainer\.heartbeat_timeout=4\)/, run.stderr);
    assert.ok(Date.now() - t0 < 60_000);
  });
});

test("a worker error prints one line by default; VERL_DEBUG=1 adds the worker's stack", async () => {
  await inWorkspace(async (ws) => {
    const ext = writeFile(ws, "boom.mjs", [
      `import { registerPolicyLoss } from ${JSON.stringify(CORE_ALGOS)};`,
      "registerPolicyLoss('boom', () => { throw new Error('boom from the user loss'); });",
    ]);
    const args = [...scratch(ws), `actor_rollout_ref.model.external_lib=${ext}`, "actor_rollout_ref.actor.policy_loss.loss_mode=boom", "trainer.total_training_steps=1"];
    const plain = await runTrain(args, { VERL_DEBUG: "" });
    assert.equal(plain.code, 1);
    assert.match(plain.stderr, /^error: updateActor failed on rank 0: Error: boom from the user loss$/m);
    assert.doesNotMatch(plain.stderr, /worker stack|^\s+at /m);
    const debug = await runTrain(args, { VERL_DEBUG: "1" });
    assert.equal(debug.code, 1);
    assert.match(debug.stderr, /--- worker stack \(rank 0\) ---\nError: boom from the user loss\n\s+at /);
  });
});

test("NaN rewards are counted and warned about; the run fails after trainer.max_consecutive_skipped_steps skipped optimizer steps", async () => {
  await inWorkspace(async (ws) => {
    const reward = writeFile(ws, "nan.mjs", ["export function compute_score() { return NaN; }"]);
    const run = await runTrain([...scratch(ws), `custom_reward_function.path=${reward}`, "trainer.total_training_steps=5",
      "trainer.max_consecutive_skipped_steps=2"], {});
    assert.equal(run.code, 1, run.stderr);
    assert.match(run.stdout, /^step:1 - (.* - )?reward\/non_finite_count:8 - /m);
    assert.match(run.stderr, /non-finite reward/);
    assert.match(run.stderr, /error: the actor skipped 2 optimizer steps in a row \(non-finite grad norm\).*trainer\.max_consecutive_skipped_steps=2/);
    assert.doesNotMatch(run.stdout, /^step:3 /m, "stops at the second skipped step");
  });
});

test("reward code that calls process.exit under the default naive manager fails the run with a message naming the file and the sample", async () => {
  await inWorkspace(async (ws) => {
    const reward = writeFile(ws, "exit.mjs", ["export function compute_score() { process.exit(7); }"]);
    const run = await runTrain([...scratch(ws), `custom_reward_function.path=${reward}`, "trainer.total_training_steps=1"], {}, undefined, 90_000);
    assert.equal(run.code, 1, run.stderr);
    assert.match(run.stderr, /error: reward function compute_score \(.*exit\.mjs\) failed on sample 0 \(data_source "stories", response ".*"\): .*(process\.exit|code 7)/);
    assert.doesNotMatch(run.stderr, /^\s+at /m);
  });
});

test("a kill between the checkpoint commit and the metrics line loses no metrics: the resumed run replays them from the checkpoint", async () => {
  await inWorkspace(async (ws) => {
    const ext = writeFile(ws, "killer.mjs", [
      `import { registerTrackingBackend } from ${JSON.stringify(TRACKING)};`,
      "// Persisting backends log in list order: this one dies before `file` writes step 2.",
      "registerTrackingBackend('kill_at_step_2', () => ({ log: (data, step) => { if (step === 2) process.kill(process.pid, 'SIGKILL'); } }));",
    ]);
    const metrics = join(ws.dir, "metrics.jsonl");
    const env = { VERL_FILE_LOGGER_PATH: metrics };
    const args = [...scratch(ws), `actor_rollout_ref.model.external_lib=${ext}`, "trainer.total_training_steps=2", "trainer.save_freq=1"];
    const killed = await runTrain([...args, "trainer.logger=[kill_at_step_2,file]"], env);
    assert.equal(killed.signal, "SIGKILL", killed.stderr);
    assert.ok(existsSync(join(ws.dir, "c", "global_step_2")), "step 2's checkpoint was committed before the kill");
    assert.deepEqual([...metricsByStep(readFileSync(metrics, "utf8")).keys()], [1]);
    const resumed = await runTrain([...args, "trainer.logger=[file]"], env);
    assert.equal(resumed.code, 0, resumed.stderr);
    const byStep = metricsByStep(readFileSync(metrics, "utf8"));
    assert.deepEqual([...byStep.keys()], [1, 2]);
    assert.equal(byStep.get(2)!["training/global_step"], 2);
    assert.ok(typeof byStep.get(2)!["actor/pg_loss"] === "number");
  });
});
