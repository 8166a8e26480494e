// The deploy files: the Kubernetes manifests validate against the Kubernetes API
// schema (kubernetes-models) and say what issue 26 asks of them; the Dockerfile's
// base is pinned; the sbatch requeues a failed step (read here; slurm.test.ts runs it
// on a real Slurm, killing a node's agent); the entrypoint forwards SIGTERM to the
// driver and the agent and exits non-zero unless both succeeded.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseAllDocuments } from "yaml";
import { Job } from "kubernetes-models/batch/v1";
import { PersistentVolumeClaim, Service } from "kubernetes-models/v1";
import { packageRoot } from "../../src/utils/paths.js";

const DEPLOY = join(packageRoot, "deploy");
type Obj = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

function manifests(): Obj[] {
  return parseAllDocuments(readFileSync(join(DEPLOY, "k8s/verl-ts.yaml"), "utf8")).map((d) => d.toJSON() as Obj);
}

function validate(o: Obj): void {
  const Model = { Job, Service, PersistentVolumeClaim }[o.kind as string];
  if (!Model) throw new Error(`no model for kind ${o.kind}`);
  new (Model as new (o: Obj) => { validate(): void })(o).validate();
}

test("the Kubernetes manifests validate against the Kubernetes schema, and a broken one does not", () => {
  const docs = manifests();
  assert.deepEqual(docs.map((d) => d.kind), ["Service", "PersistentVolumeClaim", "Job"]);
  for (const d of docs) validate(d);
  const broken = structuredClone(docs[2]!);
  broken.spec.podFailurePolicy.rules[0].action = "RestartEverything";
  assert.throws(() => validate(broken), /action/);
  const wrongType = structuredClone(docs[2]!);
  wrongType.spec.completions = "two";
  assert.throws(() => validate(wrongType));
});

test("the Job fails and restarts as one group, with GPUs, the shared volume and the node count in one place", () => {
  const [svc, pvc, job] = manifests() as [Obj, Obj, Obj];
  assert.equal(svc.spec.clusterIP, "None");
  assert.equal(svc.spec.publishNotReadyAddresses, true);
  const spec = job.spec, pod = spec.template.spec, c = pod.containers[0];
  assert.equal(spec.completionMode, "Indexed");
  assert.equal(spec.completions, spec.parallelism, "every host at once");
  assert.equal(pod.restartPolicy, "Never");
  assert.ok(spec.podFailurePolicy.rules.some((r: Obj) => r.action === "FailJob" && r.onExitCodes.values.includes(2)));
  const env = Object.fromEntries(c.env.map((e: Obj) => [e.name, e]));
  assert.equal(env.NNODES.valueFrom.fieldRef.fieldPath, "metadata.annotations['batch.kubernetes.io/job-completions']", "NNODES is read from the Job, not repeated");
  assert.equal(env.MASTER_ADDR.value, `${job.metadata.name}-0.${svc.metadata.name}`);
  assert.equal(pod.subdomain, svc.metadata.name);
  const gpus = Number(c.resources.requests["nvidia.com/gpu"]);
  assert.equal(Number(c.resources.limits["nvidia.com/gpu"]), gpus);
  assert.ok(c.args.includes(`trainer.n_gpus_per_node=${gpus}`), "one rank per GPU");
  assert.equal(pod.volumes[0].persistentVolumeClaim.claimName, pvc.metadata.name);
  assert.deepEqual(pvc.spec.accessModes, ["ReadWriteMany"]);
  assert.match(c.image, /:\d+\.\d+\.\d+$/, "a pinned image tag");
  assert.ok(c.command.includes("/app/deploy/entrypoint.sh"));
});

test("the Dockerfile pins its base image; the sbatch requeues a failed step", () => {
  const docker = readFileSync(join(DEPLOY, "Dockerfile"), "utf8");
  const from = /^FROM\s+(\S+)/m.exec(docker)?.[1] ?? "";
  assert.match(from, /^node:\d+\.\d+\.\d+-[a-z]+(-slim)?$/, `pinned base tag, got '${from}'`);
  const sbatch = join(DEPLOY, "slurm/verl-ts.sbatch");
  assert.equal(spawnSync("bash", ["-n", sbatch]).status, 0);
  const text = readFileSync(sbatch, "utf8");
  assert.match(text, /scontrol requeue "\$SLURM_JOB_ID"/);
  assert.match(text, /SLURM_RESTART_COUNT/);
  assert.match(text, /--kill-on-bad-exit=1/);
  // A requeued job appends to the first run's output (one log per job, both starts in it).
  assert.match(text, /^#SBATCH --open-mode=append$/m);
  assert.match(text, /^#SBATCH --requeue$/m);
});

/** A fake `verl` that records what it got and behaves as told by FAKE_<cmd>. */
function fakeVerl(dir: string): string {
  const p = join(dir, "verl");
  writeFileSync(p, `#!/usr/bin/env bash
cmd=$1
echo "$cmd start $*" >> "${dir}/log"
trap 'echo "$cmd got TERM" >> "${dir}/log"; kill $! 2>/dev/null; exit 143' TERM
mode_var="FAKE_$cmd"; mode="\${!mode_var:-0}"
if [ "$mode" = "sleep" ]; then sleep 30 & wait; exit 0; fi
exit "$mode"
`);
  chmodSync(p, 0o755);
  return p;
}

test("the entrypoint forwards SIGTERM to the driver and the agent, and fails unless both succeed", { timeout: 30_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-entry-"));
  try {
    const VERL = fakeVerl(dir);
    const base = { ...process.env, VERL, MASTER_ADDR: "127.0.0.1", NNODES: "2", NODE_RANK: "0", VERL_JOIN_TOKEN: "x".repeat(20) };
    const entry = join(DEPLOY, "entrypoint.sh");
    const run = (env: Record<string, string>) => spawnSync("bash", [entry, "trainer.x=1"], { env: { ...base, ...env }, encoding: "utf8" }).status;
    assert.equal(run({}), 0);
    assert.equal(run({ FAKE_train: "1" }), 1, "the driver failed");
    assert.equal(run({ FAKE_worker: "1" }), 1, "this host's agent failed");
    assert.equal(run({ NODE_RANK: "1", FAKE_worker: "1" }), 1, "an agent-only host fails with its agent");
    assert.equal(run({ VERL_JOIN_TOKEN: "" }), 2, "no token: a configuration error");

    writeFileSync(join(dir, "log"), "");
    const child = spawn("bash", [entry], { env: { ...base, FAKE_train: "sleep", FAKE_worker: "sleep" }, stdio: "ignore" });
    const exited = new Promise<number | null>((resolve) => child.on("exit", (c) => resolve(c)));
    for (let i = 0; i < 50 && (readFileSync(join(dir, "log"), "utf8").match(/start/g) ?? []).length < 2; i++) await sleep(100);
    child.kill("SIGTERM");
    const code = await exited;
    const log = readFileSync(join(dir, "log"), "utf8");
    assert.match(log, /train got TERM/);
    assert.match(log, /worker got TERM/);
    assert.equal(code, 143, log);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
