// kill -9 in the middle of training, then `trainer.resume_mode=auto`: the run
// continues after the last checkpoint with the same data order and the same
// results as a run that was never interrupted.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { makeWorkspace, metricsByStep, runTrain, scratchModel } from "./fixtures.js";

const VOLATILE = /^(timing_s\/|timing_per_token_ms\/|perf\/throughput$|perf\/time_per_step$|perf\/mfu\/|perf\/max_memory_|perf\/cpu_memory_used_gb$)/;

test("kill -9 during training, then resume_mode=auto continues at the right step with the same data and results", async () => {
  const ws = await makeWorkspace();
  try {
    const common = [...ws.overrides, ...scratchModel(32, 1), "critic.model.path=scratch", "algorithm.adv_estimator=gae",
      "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2",
      "trainer.device=wasm",
      // Sampled validation before training and at step 2: it must not shift the training streams on resume.
      "trainer.val_before_train=true", "trainer.test_freq=2",
      "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"];
    const refLog = join(ws.dir, "ref.jsonl"), runLog = join(ws.dir, "run.jsonl");
    const ref = await runTrain([...common, `trainer.default_local_dir=${ws.dir}/ref`], { VERL_FILE_LOGGER_PATH: refLog });
    assert.equal(ref.code, 0, ref.stderr);

    const ckpt = join(ws.dir, "run");
    const crashed = await runTrain([...common, `trainer.default_local_dir=${ckpt}`], { VERL_FILE_LOGGER_PATH: runLog }, (out, kill) => {
      if (/^step:1 /m.test(out)) kill();
    });
    assert.equal(crashed.signal, "SIGKILL", "the first run was killed");
    const tracked = Number(readFileSync(join(ckpt, "latest_checkpointed_iteration.txt"), "utf8"));
    assert.ok(tracked >= 1 && tracked < 3, `a checkpoint before the end exists (tracker says ${tracked})`);

    const resumed = await runTrain([...common, `trainer.default_local_dir=${ckpt}`, "trainer.resume_mode=auto"], { VERL_FILE_LOGGER_PATH: runLog });
    assert.equal(resumed.code, 0, resumed.stderr);
    assert.match(resumed.stderr, /resuming from checkpoint/);
    // The first training line (validation before training logs at the resumed step first).
    const firstStep = Number(/^step:(\d+) - .*training\/global_step/m.exec(resumed.stdout)![1]);
    assert.equal(firstStep, tracked + 1, "training restarts right after the checkpoint");

    const want = metricsByStep(readFileSync(refLog, "utf8"));
    const got = metricsByStep(readFileSync(runLog, "utf8"));
    assert.deepEqual([...got.keys()].sort(), [0, 1, 2, 3], "the metrics file holds each step once (lines after the checkpoint were dropped)");
    assert.ok("val-core/stories/reward/mean@1" in want.get(2)!, "validation ran at step 2");
    for (const step of [0, 1, 2, 3]) {
      for (const [k, v] of Object.entries(want.get(step)!)) {
        if (VOLATILE.test(k)) continue;
        const g = got.get(step)![k];
        assert.ok(g !== undefined && Math.abs(v - g) <= 1e-6 + 1e-5 * Math.abs(v), `step ${step} ${k}: uninterrupted ${v}, resumed ${g}`);
      }
    }
    // Retention counts checkpoints written before the restart too.
    assert.deepEqual(readdirSync(ckpt).filter((d) => d.startsWith("global_step_")).sort(), ["global_step_2", "global_step_3"]);
    assert.ok(existsSync(join(ckpt, "global_step_3", "actor", "huggingface", "config.json")));
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
