// Host agents on this machine for the tests and benchmarks: one `verl worker
// --join` process per "host", on 127.0.0.1 or inside a network namespace
// (`ip netns exec`, bench/netns.ts).
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { ResourcePool } from "../src/single_controller/index.js";
import { joinCluster, type JoinOptions } from "../src/single_controller/distributed/cluster.js";

export const CLI = fileURLToPath(new URL("../src/cli/main.js", import.meta.url));

export interface Agent {
  name: string;
  proc: ChildProcess;
  output: string[];
  exited: Promise<number | null>;
}

export interface HostSpec {
  name: string;
  /** Run the agent inside this network namespace. */
  netns?: string;
  nodeRank?: number;
}

export function startAgent(spec: HostSpec, join: string, token: string, extraEnv: Record<string, string> = {}): Agent {
  const args = [CLI, "worker", "--join", join, "--name", spec.name, ...(spec.nodeRank !== undefined ? ["--node-rank", String(spec.nodeRank)] : []), "--wait-s", "30"];
  const [cmd, argv] = spec.netns ? ["ip", ["netns", "exec", spec.netns, process.execPath, ...args]] : [process.execPath, args];
  const proc = spawn(cmd, argv as string[], {
    env: { ...process.env, VERL_JOIN_TOKEN: token, VERL_LOG_LEVEL: process.env.VERL_LOG_LEVEL ?? "warn", ...extraEnv },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const output: string[] = [];
  proc.stdout!.on("data", (b: Buffer) => output.push(b.toString()));
  proc.stderr!.on("data", (b: Buffer) => output.push(b.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  return { name: spec.name, proc, output, exited };
}

export interface Cluster {
  pool: ResourcePool;
  agents: Agent[];
  token: string;
  /** Destroys the pool and waits for the agents to exit (killing them after a few seconds). */
  stop(): Promise<void>;
}

/** A driver pool over `hosts` (perNode ranks each), the driver listening on `addr` port 0. */
export async function launchCluster(hosts: HostSpec[], perNode: number, opts: Partial<JoinOptions> & { addr?: string; agentEnv?: Record<string, string> } = {}): Promise<Cluster> {
  const token = randomBytes(18).toString("hex");
  process.env.VERL_JOIN_TOKEN = token;
  const agents: Agent[] = [];
  const { agentEnv, ...joinOpts } = opts;
  const remote = await joinCluster({
    nnodes: hosts.length, perNode, name: "test_pool", addr: opts.addr ?? "127.0.0.1", port: 0, joinTimeoutMs: 30_000, ...joinOpts,
    onListen: (address) => {
      for (const h of hosts) agents.push(startAgent(h, address, token, agentEnv));
    },
  }).catch((e: unknown) => {
    for (const a of agents) a.proc.kill("SIGKILL");
    const logs = agents.map((a) => `--- ${a.name} ---\n${a.output.join("")}`).join("\n");
    throw new Error(`${(e as Error).message}\n${logs}`);
  });
  const pool = new ResourcePool({ name: "test_pool", remote });
  return {
    pool, agents, token,
    stop: async () => {
      pool.markRunSucceeded();
      await pool.destroy(5000);
      await Promise.all(agents.map(async (a) => {
        const t = setTimeout(() => a.proc.kill("SIGKILL"), 5000);
        await a.exited;
        clearTimeout(t);
      }));
    },
  };
}

