// This copy of verl-ts's version (package.json), sent in the hello: hosts of one run must agree.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "../../utils/paths.js";

export const VERL_TS_VERSION: string = (JSON.parse(readFileSync(join(packageRoot, "package.json"), "utf8")) as { version?: string }).version ?? "0.0.0";
