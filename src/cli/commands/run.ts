// `verl run SCRIPT.sh [ARGS...]`: runs one of verl's shell scripts as it is. bash runs the script, so
// its variables, line continuations and "$@" (ARGS) expand as in the user's shell; `python3`, `python`
// and `torchrun` resolve to a shim (run_shim.ts) that maps verl's entry points to `verl` subcommands
// (entry_points.ts) and prints what it substituted. pip calls are skipped (verl-ts needs no Python packages).
import { spawn } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { CliError, type CommandContext } from "../context.js";

const SHIM = fileURLToPath(new URL("../run_shim.js", import.meta.url));

export async function run(ctx: CommandContext): Promise<void> {
  const script = String(ctx.options.script);
  const args = (ctx.options.args as string[] | undefined) ?? [];
  if (!existsSync(script) || !statSync(script).isFile()) throw new CliError(`verl run: ${script}: no such script`, 2);
  const dir = mkdtempSync(join(tmpdir(), "verl-run-"));
  const status = join(dir, "status");
  writeFileSync(status, "");
  try {
    const sh = (body: string, name: string) => {
      writeFileSync(join(dir, name), `#!/bin/sh\n${body}\n`);
      chmodSync(join(dir, name), 0o755);
    };
    for (const launcher of ["python3", "python", "torchrun"]) sh(`exec "${process.execPath}" "${SHIM}" ${launcher} "$@"`, launcher);
    for (const pip of ["pip", "pip3"]) sh(`echo "verl run: skipped \\\`${pip} $*\\\` (verl-ts needs no Python packages)" >&2`, pip);
    const code = await new Promise<number>((resolve, reject) => {
      const child = spawn("bash", [script, ...args], {
        stdio: "inherit",
        env: { ...process.env, PATH: `${dir}:${process.env.PATH ?? ""}`, VERL_RUN_STATUS: status },
      });
      child.on("error", (e) => reject(new CliError(`verl run: cannot start bash: ${e.message}`, 2)));
      child.on("close", (c, signal) => resolve(c ?? (signal ? 128 : 1)));
    });
    const lines = readFileSync(status, "utf8").split("\n").filter((l) => l !== "");
    const refused = lines.find((l) => l.startsWith("refused "));
    if (refused) throw new CliError(`verl run: ${script}: ${refused.slice("refused ".length)}`, 2);
    const ran = lines.filter((l) => l.startsWith("ran "));
    if (ran.length === 0) throw new CliError(`verl run: ${script} called no verl entry point (python3 -m verl.trainer.<name>)${code !== 0 ? `; bash exited ${code}` : ""}`, code || 2);
    const failed = ran.find((l) => l.split(" ")[1] !== "0");
    if (failed) throw new CliError(`verl run: ${script}: \`${failed.split(" ").slice(2).join(" ")}\` exited ${failed.split(" ")[1]}`, Number(failed.split(" ")[1]) || 1);
    if (code !== 0) throw new CliError(`verl run: ${script}: bash exited ${code} after the verl call`, code);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
