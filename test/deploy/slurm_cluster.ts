// A real Slurm on this machine for the deploy tests: Debian's slurm-wlm daemons,
// slurmctld and slurmd "n1" in one network namespace, slurmd "n2" in another
// (bench/netns.ts: a veth pair, 10.231.0.1 and 10.231.0.2), each node with its
// own host name (a UTS namespace) and /etc/hosts (ip netns exec's /etc/netns/NAME),
// config files in a temp dir. Nothing is installed here: `slurmAbsent()` says why
// the test cannot run. Authentication is auth/none (Slurm 22.05 still ships it;
// munge would need a key and a daemon per node and adds nothing to what is tested).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { createNetnsPair } from "../../bench/netns.js";

const TOOLS = ["slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "unshare"];

function which(cmd: string): string | undefined {
  const dirs = [...(process.env.PATH ?? "").split(delimiter), "/usr/sbin", "/usr/bin", "/sbin"];
  for (const d of dirs) if (d && existsSync(join(d, cmd))) return join(d, cmd);
  return undefined;
}

/** Why a real Slurm cannot run here (undefined: it can). */
export function slurmAbsent(): string | undefined {
  const missing = TOOLS.filter((t) => !which(t));
  if (missing.length) return `Slurm is absent (${missing.join(", ")} not found; apt-get install slurm-wlm)`;
  if (process.platform !== "linux" || process.getuid?.() !== 0) return "a Slurm cluster in network namespaces needs Linux and root";
  return undefined;
}

export interface SlurmCluster {
  dir: string;
  /** Namespaces of node n1 (slurmctld, the batch host) and n2. */
  netns: [string, string];
  /** Runs a Slurm client command in n1's namespace with this cluster's config. */
  client(cmd: string, args: string[], env?: Record<string, string>): { status: number | null; stdout: string; stderr: string };
  /** `scontrol show job` as key=value pairs (JobState, Restarts, ExitCode, ...). */
  job(id: string): Record<string, string>;
  env: Record<string, string>;
  /** The daemons' logs (for failure messages). */
  logs(): string;
  /** Stops every daemon and job process, removes the namespaces, /etc/netns entries and the temp dir. */
  stop(): Promise<void>;
}

function slurmConf(dir: string, addrs: [string, string]): string {
  return `# written by test/deploy/slurm_cluster.ts
ClusterName=verlts
SlurmctldHost=n1(${addrs[0]})
AuthType=auth/none
# A requeued batch job waits cred_expire before it may start again (default 120 s): 10 s keeps the test short.
AuthInfo=cred_expire=10
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/spool-%n
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd-%n.pid
SlurmctldLogFile=${dir}/slurmctld.log
SlurmdLogFile=${dir}/slurmd-%n.log
# No cgroups for jobs (a container's cgroup tree is not ours to change): processes are tracked by parent id.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
ReturnToService=2
SlurmdTimeout=30
# Finished jobs stay visible to scontrol for the test's checks.
MinJobAge=600
KillWait=5
NodeName=n1 NodeAddr=${addrs[0]} CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=${addrs[1]} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
`;
}

/** Processes inside a network namespace (job steps, agents, daemons). */
export function netnsPids(ns: string): number[] {
  const r = spawnSync("ip", ["netns", "pids", ns], { encoding: "utf8" });
  return (r.stdout ?? "").split(/\s+/).filter(Boolean).map(Number);
}

export function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
  } catch {
    return "";
  }
}

/**
 * Starts slurmctld and two slurmd; resolves once both nodes are idle (or throws, having cleaned up),
 * or to the reason when this machine cannot make the nodes' network namespaces.
 */
export async function startSlurm(tag: string, readyMs = 30_000): Promise<SlurmCluster | string> {
  const pair = createNetnsPair(tag);
  if (typeof pair === "string") return `cannot make the two nodes' network namespaces: ${pair}`;
  const dir = mkdtempSync(join(tmpdir(), "verl-slurm-"));
  const etc = pair.names.map((n) => join("/etc/netns", n));
  const daemons: ChildProcess[] = [];
  const conf = join(dir, "slurm.conf");
  const env = { SLURM_CONF: conf };
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    for (const d of daemons) d.kill("SIGTERM");
    await Promise.race([Promise.all(daemons.map((d) => (d.exitCode !== null || d.signalCode !== null ? undefined : new Promise((r) => d.once("exit", r))))), sleep(5000)]);
    // Whatever is left in the two namespaces was started by these daemons (job steps, agents, drivers).
    for (let round = 0; round < 3; round++) {
      const left = pair.names.flatMap(netnsPids);
      if (!left.length) break;
      for (const pid of left) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone already
        }
      }
      await sleep(200);
    }
    pair.remove();
    for (const e of etc) rmSync(e, { recursive: true, force: true });
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    mkdirSync(join(dir, "state"));
    for (const n of ["n1", "n2"]) mkdirSync(join(dir, `spool-${n}`));
    writeFileSync(conf, slurmConf(dir, pair.addrs));
    // cgroup.conf beside slurm.conf: slurmd 22.05 loads a cgroup plugin even when jobs use none,
    // and its autodetection fails on a v1/v2 hybrid mount.
    writeFileSync(join(dir, "cgroup.conf"), "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n");
    const hosts = `127.0.0.1 localhost\n${pair.addrs[0]} n1\n${pair.addrs[1]} n2\n`;
    for (const e of etc) {
      mkdirSync(e, { recursive: true });
      writeFileSync(join(e, "hosts"), hosts);
    }
    const daemon = (ns: string, host: string, cmd: string) => {
      // ip netns exec, unshare and sh all exec: the child's pid is the daemon's.
      const p = spawn("ip", ["netns", "exec", ns, "unshare", "--uts", "sh", "-c", `hostname ${host} && exec ${cmd} -D -f ${conf}`], { stdio: ["ignore", "ignore", "ignore"] });
      daemons.push(p);
    };
    daemon(pair.names[0], "n1", "slurmctld");
    daemon(pair.names[0], "n1", "slurmd");
    daemon(pair.names[1], "n2", "slurmd");
    const client = (cmd: string, args: string[], extra: Record<string, string> = {}) => {
      const r = spawnSync("ip", ["netns", "exec", pair.names[0], cmd, ...args], { cwd: dir, env: { ...process.env, ...env, ...extra }, encoding: "utf8", timeout: 30_000 });
      return { status: r.status, stdout: r.stdout ?? "", stderr: r.stderr ?? "" };
    };
    const logs = () => readdirSync(dir).filter((f) => f.endsWith(".log")).map((f) => `--- ${f} ---\n${readFileSync(join(dir, f), "utf8").slice(-3000)}`).join("\n");
    const t0 = Date.now();
    let states = "";
    while (Date.now() - t0 < readyMs) {
      states = client("sinfo", ["-h", "-N", "-o", "%N %t"]).stdout.trim();
      if (/^n1 idle$/m.test(states) && /^n2 idle$/m.test(states)) {
        const job = (id: string) => Object.fromEntries(client("scontrol", ["show", "job", "-o", id]).stdout.trim().split(/\s+/).map((kv) => {
          const i = kv.indexOf("=");
          return [kv.slice(0, i), kv.slice(i + 1)];
        }));
        return { dir, netns: pair.names, client, job, env, logs, stop };
      }
      const dead = daemons.find((d) => d.exitCode !== null);
      if (dead) throw new Error(`a Slurm daemon exited (${dead.spawnargs.slice(-1)[0]}, code ${dead.exitCode}):\n${logs()}`);
      await sleep(300);
    }
    throw new Error(`Slurm's two nodes were not idle within ${readyMs / 1000} s (sinfo: '${states}'):\n${logs()}`);
  } catch (e) {
    await stop();
    throw e;
  }
}
