#!/usr/bin/env node
// The `verl` command. The CLI is compiled TypeScript under dist/ (npm run build).
import { existsSync } from "node:fs";

const main = new URL("../dist/src/cli/main.js", import.meta.url);
if (!existsSync(main)) {
  process.stderr.write("error: verl-ts is not built: run `npm run build` first (dist/src/cli/main.js is missing)\n");
  process.exit(1);
}
const { runCli } = await import(main.href);
process.exit(await runCli(process.argv));
