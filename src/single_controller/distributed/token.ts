// The run's join token: only processes that present it may join the driver or
// a host's ring. The driver takes VERL_JOIN_TOKEN, else the file
// VERL_JOIN_TOKEN_FILE (default ~/.verl-ts/join_token) when it exists, else
// generates one and writes that file (mode 0600) for the agents to read.
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

export function defaultTokenFile(env: NodeJS.ProcessEnv = process.env): string {
  return env.VERL_JOIN_TOKEN_FILE || join(homedir(), ".verl-ts", "join_token");
}

function check(token: string, where: string): string {
  const t = token.trim();
  if (t.length < 16) throw new Error(`${where}: the join token must have at least 16 characters, got ${t.length}`);
  return t;
}

/** The driver's token: given, or generated and written where the agents look. */
export function driverToken(env: NodeJS.ProcessEnv = process.env): { token: string; file?: string; generated: boolean } {
  if (env.VERL_JOIN_TOKEN) return { token: check(env.VERL_JOIN_TOKEN, "VERL_JOIN_TOKEN"), generated: false };
  const file = defaultTokenFile(env);
  if (env.VERL_JOIN_TOKEN_FILE && existsSync(file)) return { token: check(readFileSync(file, "utf8"), file), file, generated: false };
  const token = randomBytes(24).toString("base64url");
  mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${token}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
  return { token, file, generated: true };
}

/** The agent's token: --token-file, VERL_JOIN_TOKEN, or the token file (waited for up to waitMs, the driver may still be writing it). */
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
