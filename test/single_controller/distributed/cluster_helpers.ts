// Launches a pool spanning "hosts" for the tests: the driver in this process
// (joinCluster on a free port) and one agent process per host (bench/hosts.ts),
// and `verl` commands in child processes.
import { spawn } from "node:child_process";
import { CLI, launchCluster, startAgent, type Agent, type HostSpec } from "../../../bench/hosts.js";

export { launchCluster, startAgent, type Agent, type HostSpec };

export interface CliRun {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** When the process exited (Date.now()). */
  endedAt: number;
}

/** Runs `verl <args>` (in a network namespace when `netns` is set); `onOutput` sees stdout as it grows. */
export function runVerl(args: string[], env: Record<string, string>, opts: { netns?: string; onOutput?: (stdout: string) => void } = {}): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const [cmd, argv] = opts.netns ? ["ip", ["netns", "exec", opts.netns, process.execPath, CLI, ...args]] : [process.execPath, [CLI, ...args]];
    const child = spawn(cmd, argv as string[], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "", stderr = "";
    child.stdout!.on("data", (b: Buffer) => {
      stdout += b.toString();
      opts.onOutput?.(stdout);
    });
    child.stderr!.on("data", (b: Buffer) => (stderr += b.toString()));
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr, endedAt: Date.now() }));
  });
}

/** A free TCP port on 127.0.0.1 (closed again before use; fine for tests). */
export async function freePort(): Promise<number> {
  const { createServer } = await import("node:net");
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}
