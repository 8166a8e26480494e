// The run's join token and run id. Only processes that prove the token (auth.ts)
// may join the driver or a host's ring; the token itself never crosses the network.
// The driver takes VERL_JOIN_TOKEN, else the file VERL_JOIN_TOKEN_FILE when that is
// set and exists, else generates one; a generated token is written (mode 0600, to a
// temp file then renamed) only once the driver holds its port, so a second driver
// that fails to bind never replaces the live run's token. The run id is VERL_RUN_ID
// (a launcher's job id) or a fresh one; with VERL_RUN_ID set the default token file
// is per run (~/.verl-ts/join_token.<run id>), so an agent started before its driver
// waits for its own run's file rather than reading a finished run's.
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

export function runIdFromEnv(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const id = env.VERL_RUN_ID;
  if (id === undefined || id === "") return undefined;
  if (!/^[A-Za-z0-9._-]{1,128}$/.test(id)) throw new Error(`VERL_RUN_ID='${id}' must be 1-128 letters, digits, '.', '_' or '-'`);
  return id;
}

export function defaultTokenFile(env: NodeJS.ProcessEnv = process.env): string {
  if (env.VERL_JOIN_TOKEN_FILE) return env.VERL_JOIN_TOKEN_FILE;
  const id = runIdFromEnv(env);
  return join(homedir(), ".verl-ts", id ? `join_token.${id}` : "join_token");
}

function check(token: string, where: string): string {
  const t = token.trim();
  if (t.length < 16) throw new Error(`${where}: the join token must have at least 16 characters, got ${t.length}`);
  return t;
}

export interface DriverToken {
  token: string;
  runId: string;
  /** Where a generated token is to be written (publishToken) once the driver listens. */
  file?: string;
  generated: boolean;
}

/** The driver's token and run id; nothing is written yet. */
export function driverToken(env: NodeJS.ProcessEnv = process.env): DriverToken {
  const runId = runIdFromEnv(env) ?? randomBytes(8).toString("hex");
  if (env.VERL_JOIN_TOKEN) return { token: check(env.VERL_JOIN_TOKEN, "VERL_JOIN_TOKEN"), runId, generated: false };
  const file = defaultTokenFile(env);
  if (env.VERL_JOIN_TOKEN_FILE && existsSync(file)) return { token: check(readFileSync(file, "utf8"), file), runId, file, generated: false };
  return { token: randomBytes(24).toString("base64url"), runId, file, generated: true };
}

/** Writes a generated token where the agents look: a temp file (0600) renamed over the old one. */
export function publishToken(t: DriverToken): void {
  if (!t.generated || !t.file) return;
  mkdirSync(dirname(t.file), { recursive: true, mode: 0o700 });
  const tmp = `${t.file}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  writeFileSync(tmp, `${t.token}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, t.file);
}

/** The agent's token: --token-file, VERL_JOIN_TOKEN, or the token file (waited for up to waitMs, the driver may not have written it yet). */
export async function agentToken(opts: { tokenFile?: string; waitMs: number }, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (!opts.tokenFile && env.VERL_JOIN_TOKEN) return check(env.VERL_JOIN_TOKEN, "VERL_JOIN_TOKEN");
  const file = opts.tokenFile ?? defaultTokenFile(env);
  const deadline = Date.now() + opts.waitMs;
  while (!existsSync(file)) {
    if (Date.now() >= deadline) {
      throw new Error(`no join token: set VERL_JOIN_TOKEN or pass --token-file; ${file} did not appear within ${opts.waitMs / 1000} s (the driver writes it when it generates one)`);
    }
    await sleep(200);
  }
  return check(readFileSync(file, "utf8"), file);
}
