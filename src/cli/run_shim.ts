// The launcher shim of `verl run` (commands/run.ts): bash runs the user's script with `python3`,
// `python` and `torchrun` on PATH pointing here. Each call of one of verl's entry points runs the
// mapped `verl` subcommand in this process; anything else is refused by name. Every outcome is
// appended to $VERL_RUN_STATUS so `verl run` can report it whatever the script does with exit codes.
import { appendFileSync } from "node:fs";
import { EntryPointError, mapLauncherCall } from "./entry_points.js";
import { runCli } from "./main.js";

function record(line: string): void {
  const file = process.env.VERL_RUN_STATUS;
  if (file) appendFileSync(file, `${line.replace(/\n/g, " ")}\n`);
}

const [launcher, ...args] = process.argv.slice(2);
let code: number;
try {
  const { argv, notes } = mapLauncherCall(launcher ?? "python3", args);
  for (const n of notes) process.stderr.write(`verl run: ${n}\n`);
  code = await runCli([process.argv[0]!, "verl", ...argv]);
  record(`ran ${code} verl ${argv[0]}`);
} catch (e) {
  const msg = e instanceof EntryPointError ? e.message : `verl run: ${(e as Error).message}`;
  process.stderr.write(`verl run: refused ${msg}\n`);
  record(`refused ${msg}`);
  code = 2;
}
process.exit(code);
