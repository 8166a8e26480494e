// deploy/slurm/verl-ts.sbatch on a real Slurm (Debian's slurm-wlm; slurm_cluster.ts):
// slurmctld and two slurmd nodes in two network namespaces. The stories GRPO run
// as a 2-node job, once uninterrupted and once with node n2's agent SIGKILLed after
// step 3: the failed step must requeue the job (the sbatch's own `scontrol requeue`,
// since --requeue alone does not requeue a job whose step failed), the requeued job
// resumes from the step-3 checkpoint (resume_mode=auto) and finishes with the same
// curves as the uninterrupted job. Skips with one line where Slurm, root or the
// stories260K model is absent; installs nothing (.ci/run installs slurm-wlm).
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { packageRoot } from "../../src/utils/paths.js";
import { CLI, makeWorkspace, metricsByStep, stories } from "../trainer/ppo/trainer/fixtures.js";
import { cmdline, netnsPids, slurmAbsent, startSlurm, type SlurmCluster } from "./slurm_cluster.js";

const STEPS = 5;
const KILL_AFTER = 3;
const JOB_LIMIT_MS = 240_000; // about 25 s on an idle 2-core VM, 55 s with the VM at load 13
const VOLATILE = /^(timing_s\/|timing_per_token_ms\/|perf\/|global_seqlen\/)/;
const FINAL = new Set(["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"]);

interface JobResult {
  id: string;
  info: Record<string, string>;
  output: string;
  metrics: Map<number, Record<string, number>>;
  seconds: number;
}

/** Submits the sbatch as a 2-node job and waits for its final state; `onStep` sees each new metrics step. */
async function runJob(slurm: SlurmCluster, label: string, overrides: string[], onStep?: (step: number, lastLogged: number) => void): Promise<JobResult> {
  const log = join(slurm.dir, `metrics-${label}.jsonl`);
  const env = {
    VERL: `${process.execPath} ${CLI}`, VERL_TS_HOME: packageRoot, HOME: join(slurm.dir, "home"),
    VERL_FILE_LOGGER_PATH: log, VERL_JOIN_TIMEOUT_S: "60", VERL_MAX_RESTARTS: "2",
  };
  const t0 = Date.now();
  // The sbatch asks for 8 GPUs and 16 CPUs a node; these nodes have 2 CPUs and no GPU: the command line wins.
  const sub = slurm.client("sbatch", ["--parsable", "--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", `--output=${slurm.dir}/job-${label}-%j.out`,
    join(packageRoot, "deploy/slurm/verl-ts.sbatch"), ...overrides], env);
  assert.equal(sub.status, 0, `sbatch failed: ${sub.stderr}`);
  const id = sub.stdout.trim().split(";")[0]!;
  const outFile = join(slurm.dir, `job-${label}-${id}.out`);
  const read = (f: string) => (existsSync(f) ? readFileSync(f, "utf8") : "");
  let seen = 0;
  let info: Record<string, string> = {};
  while (Date.now() - t0 < JOB_LIMIT_MS) {
    const steps = [...metricsByStep(read(log)).keys()];
    const last = Math.max(seen, ...steps);
    for (const s of steps.filter((s) => s > seen).sort((a, b) => a - b)) onStep?.(s, last);
    seen = last;
    info = slurm.job(id);
    if (FINAL.has(info.JobState ?? "")) break;
    await sleep(200);
  }
  const output = read(outFile);
  if (!FINAL.has(info.JobState ?? "")) {
    slurm.client("scancel", [id]);
    assert.fail(`job ${id} (${label}) did not finish within ${JOB_LIMIT_MS / 1000} s (state ${info.JobState}):\n${output.slice(-4000)}\n${slurm.logs()}`);
  }
  return { id, info, output, metrics: metricsByStep(read(log)), seconds: (Date.now() - t0) / 1000 };
}

test("the sbatch on a real 2-node Slurm: a SIGKILLed agent after step 3 requeues the job, which resumes and ends with the uninterrupted curves", { timeout: 600_000 }, async (t) => {
  const absent = slurmAbsent();
  if (absent) return void t.skip(absent);
  const model = stories();
  if (!model) return void t.skip("../shared/models/stories260K absent");
  const t0 = Date.now();
  const slurm = await startSlurm(`s${process.pid % 100000}`);
  if (typeof slurm === "string") return void t.skip(slurm);
  let wsDir: string | undefined;
  try {
    const ws = await makeWorkspace();
    wsDir = ws.dir;
    const overrides = (ckpt: string) => [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true",
      "trainer.n_gpus_per_node=1", `trainer.total_training_steps=${STEPS}`, "trainer.save_freq=1", "trainer.logger=[console,file]", `trainer.default_local_dir=${join(slurm.dir, ckpt)}`];

    // The control: Slurm's --requeue alone leaves a job whose step failed FAILED, never requeued
    // (why the sbatch requeues itself). A 2-node step whose task on node 1 is SIGKILLed.
    const plain = join(slurm.dir, "plain.sbatch");
    writeFileSync(plain, "#!/usr/bin/env bash\n#SBATCH --requeue\n#SBATCH --ntasks-per-node=1\n"
      + `srun --kill-on-bad-exit=1 bash -c 'if [ "$SLURM_NODEID" = 1 ]; then sleep 1; kill -9 $$; fi; sleep 60'\nexit 1\n`);
    const sub = slurm.client("sbatch", ["--parsable", "--nodes=2", `--output=${slurm.dir}/plain-%j.out`, plain]);
    assert.equal(sub.status, 0, sub.stderr);
    const plainId = sub.stdout.trim();
    for (let i = 0; i < 120 && !FINAL.has(slurm.job(plainId).JobState ?? ""); i++) await sleep(250);
    const control = slurm.job(plainId);
    assert.deepEqual([control.JobState, control.Requeue, control.Restarts], ["FAILED", "1", "0"], "a --requeue job whose step failed is not requeued by Slurm");

    const whole = await runJob(slurm, "whole", overrides("ckpt-whole"));
    assert.equal(whole.info.JobState, "COMPLETED", `${whole.output.slice(-4000)}\n${slurm.logs()}`);
    assert.equal(whole.info.Restarts, "0");
    assert.match(whole.output, /verl-ts: the run succeeded/);

    let killed: { pid: number; at: number; lastLogged: number } | undefined;
    const [, n2] = slurm.netns;
    const broken = await runJob(slurm, "killed", overrides("ckpt-killed"), (step, last) => {
      if (killed || step !== KILL_AFTER) return;
      // Node n2's `verl worker` (its entrypoint, slurmstepd and slurmd stay): SIGKILL, no goodbye.
      const agent = netnsPids(n2).find((pid) => / worker --join /.test(cmdline(pid)));
      assert.ok(agent, `no agent process in n2's namespace after step ${KILL_AFTER}`);
      process.kill(agent, "SIGKILL");
      killed = { pid: agent, at: Date.now(), lastLogged: last };
    });
    const out = broken.output;
    // On failure: the launcher's lines and the errors, then the tail (the metric lines are long).
    const brief = () => `${out.split("\n").filter((l) => /verl-ts:|error|srun|resuming|^step:/i.test(l)).map((l) => l.slice(0, 200)).join("\n")}\n${slurm.logs()}`;
    assert.ok(killed, `step ${KILL_AFTER} never logged:\n${brief()}`);
    assert.equal(broken.info.JobState, "COMPLETED", brief());
    assert.equal(broken.info.Restarts, "1", `requeued once:\n${brief()}`);
    assert.equal(broken.info.ExitCode, "0:0");
    assert.match(out, /host 'n2' \(node 1/, "the driver names the lost host");
    assert.match(out, /verl-ts: the step failed \(exit \d+\); requeueing job/);
    assert.match(out, /start 2 of at most 3/);
    const second = out.slice(out.indexOf("start 2 of at most 3"));
    // The last checkpoint is step 3's, or step 4's when step 4 was saved between the poll and the kill.
    const from = Number(/resuming from checkpoint .*"step":(\d+)/.exec(second)?.[1]);
    assert.ok(from >= KILL_AFTER && from <= killed.lastLogged + 1 && from < STEPS, `the requeued job resumes from the last checkpoint (step ${from}, ${killed.lastLogged} logged at the kill):\n${second.slice(0, 3000)}`);
    const trained = [...second.matchAll(/^step:(\d+) /gm)].map((m) => Number(m[1]));
    assert.deepEqual(trained, Array.from({ length: STEPS - from }, (_, i) => from + 1 + i), "the requeued job trains only the steps after its checkpoint");
    assert.match(second, /verl-ts: the run succeeded/);

    // The curves: every step's metrics of the requeued job equal the uninterrupted job's.
    for (let step = 1; step <= STEPS; step++) {
      const want = whole.metrics.get(step), got = broken.metrics.get(step);
      assert.ok(want && got, `step ${step} missing (uninterrupted: ${!!want}, requeued: ${!!got})`);
      for (const [k, v] of Object.entries(want)) {
        if (VOLATILE.test(k)) continue;
        assert.ok(k in got, `step ${step} lacks ${k} after the requeue`);
        assert.equal(got[k], v, `step ${step} ${k}: uninterrupted ${v}, requeued ${got[k]}`);
      }
    }
    const curve = (r: JobResult, k: string) => Array.from({ length: STEPS }, (_, i) => r.metrics.get(i + 1)![k]!.toPrecision(6)).join(", ");
    for (const line of out.split("\n").filter((l) => /verl-ts:|error:|resuming from checkpoint/.test(l))) t.diagnostic(`job ${broken.id}: ${line.slice(0, 240)}`);
    for (const k of ["actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean"]) {
      t.diagnostic(`${k}: uninterrupted [${curve(whole, k)}]; killed after step ${KILL_AFTER} and requeued [${curve(broken, k)}]`);
    }
    t.diagnostic(`uninterrupted job ${whole.seconds.toFixed(1)} s; killed+requeued job ${broken.seconds.toFixed(1)} s (the kill ${((killed.at - Date.now()) / -1000).toFixed(1)} s before its end); whole test ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  } finally {
    await slurm.stop();
    if (wsDir) rmSync(wsDir, { recursive: true, force: true });
  }
});
