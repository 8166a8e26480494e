// `verl worker --join HOST:PORT`: this host's agent in a run spanning hosts
// (trainer.nnodes > 1). It starts this host's rank threads when the driver
// says so and runs their tasks until the driver ends the run.
import { runAgent } from "../../single_controller/distributed/agent.js";
import { CliError, type CommandContext } from "../context.js";

function optInt(v: unknown, flag: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new CliError(`verl worker: ${flag} must be a non-negative integer, got '${String(v)}'`, 2);
  return n;
}

export async function run(ctx: CommandContext): Promise<void> {
  const o = ctx.options;
  const waitS = optInt(o.waitS, "--wait-s");
  const nodeRank = optInt(o.nodeRank, "--node-rank");
  const ringPort = optInt(o.ringPort, "--ring-port");
  const { code, why } = await runAgent({
    ...(typeof o.join === "string" ? { join: o.join } : {}),
    ...(typeof o.name === "string" ? { name: o.name } : {}),
    ...(typeof o.bind === "string" ? { bind: o.bind } : {}),
    ...(typeof o.tokenFile === "string" ? { tokenFile: o.tokenFile } : {}),
    ...(ringPort !== undefined ? { ringPort } : {}),
    ...(nodeRank !== undefined ? { nodeRank } : {}),
    ...(waitS !== undefined ? { waitMs: waitS * 1000 } : {}),
  });
  // The reason goes to stderr here too: the logger is asynchronous and the process exits next.
  if (code !== 0) throw new CliError(`verl worker: ${why}`, code);
}
