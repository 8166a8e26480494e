// The stories GRPO recipe on a pool of two hosts of one rank each (a driver and
// two `verl worker` agents), against the same run on two local ranks. Each host
// scenario: train; SIGKILL host B's agent right after step 1 (mid step 2) — the
// driver must fail within 10 s naming host B; then `trainer.resume_mode=auto`
// with fresh agents finishes steps 2-3. Steps 1-3 must match the local curves.
// Hosts are two network namespaces joined by a veth pair when this machine can
// make them (root + iproute2), and always two agent processes on 127.0.0.1.
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../../src/config/index.js";
import { runPpo } from "../../../src/trainer/main_ppo.js";
import { makeWorkspace, metricsByStep, stories, type Workspace } from "../../trainer/ppo/trainer/fixtures.js";
import { freePort, runVerl, startAgent, type Agent } from "./cluster_helpers.js";
import { createNetnsPair } from "../../../bench/netns.js";

const VOLATILE = /^(timing_s\/|timing_per_token_ms\/|perf\/|global_seqlen\/)/;
const STEPS = 3;

let workspace: Workspace | undefined;
let baseline: Record<string, number>[] | undefined;

function common(ws: Workspace, model: string): string[] {
  return [...ws.overrides, `actor_rollout_ref.model.path=${model}`, "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true",
    `trainer.total_training_steps=${STEPS}`, "trainer.save_freq=1", "trainer.logger=[console,file]"];
}

/** The two-local-rank run, once for both scenarios. */
async function localCurves(ws: Workspace, model: string): Promise<Record<string, number>[]> {
  baseline ??= await (async () => {
    const config = loadConfig({ configName: "ppo_trainer", overrides: [...common(ws, model), "trainer.n_gpus_per_node=2", "trainer.logger=[]", `trainer.default_local_dir=${ws.dir}/local`] });
    return (await runPpo(config)).history.map((h) => h.metrics);
  })();
  return baseline;
}

interface Hosts {
  label: string;
  masterAddr: string;
  port: number;
  /** Namespaces of the driver, host A and host B (undefined: this one). */
  netns: [string | undefined, string | undefined, string | undefined];
}

async function scenario(t: TestContext, hosts: Hosts): Promise<void> {
  const model = stories();
  if (!model) return void t.skip("../shared/models/stories260K absent");
  workspace ??= await makeWorkspace();
  const ws = workspace;
  const local = await localCurves(ws, model);
  const ckpt = join(ws.dir, `ckpt-${hosts.label}`), log = join(ws.dir, `metrics-${hosts.label}.jsonl`);
  const token = `test-token-${process.pid}-${hosts.label}`;
  const env = { MASTER_ADDR: hosts.masterAddr, MASTER_PORT: String(hosts.port), VERL_JOIN_TOKEN: token, VERL_FILE_LOGGER_PATH: log, VERL_JOIN_TIMEOUT_S: "30" };
  const args = ["train", ...common(ws, model), "trainer.nnodes=2", "trainer.n_gpus_per_node=1", `trainer.default_local_dir=${ckpt}`];
  const join_ = `${hosts.masterAddr}:${hosts.port}`;
  const agents = (): Agent[] => [
    startAgent({ name: "hostA", nodeRank: 0, ...(hosts.netns[1] ? { netns: hosts.netns[1] } : {}) }, join_, token),
    startAgent({ name: "hostB", nodeRank: 1, ...(hosts.netns[2] ? { netns: hosts.netns[2] } : {}) }, join_, token),
  ];
  const ns = hosts.netns[0] ? { netns: hosts.netns[0] } : {};
  const logs = (a: Agent[]) => a.map((x) => `--- ${x.name} ---\n${x.output.join("").slice(-3000)}`).join("\n");

  // Run 1: host B's agent is killed mid step 2.
  const first = agents();
  let killedAt: number | undefined;
  const crashed = await runVerl(args, env, {
    ...ns,
    onOutput: (out) => {
      if (killedAt === undefined && /^step:1 /m.test(out)) {
        killedAt = Date.now();
        first[1]!.proc.kill("SIGKILL");
      }
    },
  });
  for (const a of first) {
    const timer = setTimeout(() => a.proc.kill("SIGKILL"), 10_000);
    await a.exited;
    clearTimeout(timer);
  }
  assert.ok(killedAt !== undefined, `step 1 never finished:\n${crashed.stdout.slice(-2000)}\n${crashed.stderr.slice(-3000)}\n${logs(first)}`);
  assert.notEqual(crashed.code, 0, "the step with a lost host fails");
  const failedIn = crashed.endedAt - killedAt!;
  assert.ok(failedIn < 10_000, `the driver failed ${failedIn} ms after the kill (limit 10 s)`);
  assert.match(crashed.stderr, /error: .*host 'hostB'/, `the error names host B:\n${crashed.stderr.slice(-2000)}`);
  t.diagnostic(`${hosts.label}: driver failed ${failedIn} ms after host B's agent was killed: ${/error: .*/.exec(crashed.stderr)?.[0].slice(0, 200)}`);

  // Run 2: fresh agents, resume_mode=auto continues after the step-1 checkpoint.
  const second = agents();
  const resumed = await runVerl([...args, "trainer.resume_mode=auto"], env, ns);
  for (const a of second) await a.exited;
  assert.equal(resumed.code, 0, `${resumed.stderr.slice(-3000)}\n${logs(second)}`);
  assert.match(resumed.stderr, /resuming from checkpoint/);
  assert.match(resumed.stdout, /^step:2 /m, "the resumed run starts at step 2");

  const byStep = metricsByStep(readFileSync(log, "utf8"));
  for (let step = 1; step <= STEPS; step++) {
    const got = byStep.get(step), want = local[step - 1]!;
    assert.ok(got, `${hosts.label}: no metrics for step ${step}`);
    for (const [k, v] of Object.entries(want)) {
      if (VOLATILE.test(k)) continue;
      const g = got![k];
      assert.ok(g !== undefined, `${hosts.label}: step ${step} lacks ${k}`);
      assert.ok(Math.abs(v - g!) <= 1e-6 + 1e-4 * Math.abs(v), `${hosts.label}: step ${step} ${k}: 2 local ranks ${v}, 2 hosts ${g}`);
    }
  }
  for (const k of ["actor/kl_loss", "actor/grad_norm", "actor/entropy"]) assert.ok(Number.isFinite(byStep.get(STEPS)![k]), `${k} is logged`);
}

test("stories GRPO on two network-namespace hosts: same curves as 2 local ranks; a killed host fails the step naming it; resume continues", { timeout: 120_000 }, async (t) => {
  const pair = createNetnsPair();
  if (typeof pair === "string") return void t.skip(`cannot make network namespaces here: ${pair}`);
  try {
    // The driver and host A share namespace A (one machine), host B is the other namespace.
    await scenario(t, { label: "netns", masterAddr: pair.addrs[0], port: 29500, netns: [pair.names[0], pair.names[0], pair.names[1]] });
  } finally {
    pair.remove();
  }
});

test("stories GRPO on two agent processes on 127.0.0.1: same curves, a killed host fails the step naming it, resume continues", { timeout: 120_000 }, async (t) => {
  try {
    await scenario(t, { label: "loopback", masterAddr: "127.0.0.1", port: await freePort(), netns: [undefined, undefined, undefined] });
  } finally {
    if (workspace) rmSync(workspace.dir, { recursive: true, force: true });
  }
});
