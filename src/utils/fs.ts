// Atomic writes: write to a temporary file beside the target, then rename, so a
// crash never leaves a half-written file behind.
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { dirname, basename, join } from "node:path";

/** An error from writing `path` (by `who`, e.g. a logger) that names it (node's write errors name no file) and says what to do about a full disk. */
export function writeErrorAt(path: string, e: unknown, what = "", who = ""): Error {
  const err = e as NodeJS.ErrnoException;
  const hint = err.code === "ENOSPC" || err.code === "EDQUOT" ? "; the disk is full: free space there or point this output elsewhere" : "";
  return Object.assign(new Error(`${who ? `${who}: ` : ""}cannot write ${what ? `${what} ` : ""}${path}: ${err.message ?? String(e)}${hint}`, { cause: e }), { code: err.code });
}

export function writeFileAtomic(path: string, data: string | Uint8Array): void {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = join(dirname(path), `.${basename(path)}.tmp-${process.pid}-${Date.now()}`);
  try {
    writeFileSync(tmp, data);
    renameSync(tmp, path);
  } catch (e) {
    if (existsSync(tmp)) rmSync(tmp, { force: true });
    throw writeErrorAt(path, e);
  }
}

/** Build a directory under a temporary name and rename it into place when `fill` succeeds. */
export async function writeDirAtomic(path: string, fill: (tmpDir: string) => Promise<void> | void): Promise<void> {
  mkdirSync(dirname(path), { recursive: true });
  const tmp = join(dirname(path), `.${basename(path)}.tmp-${process.pid}-${Date.now()}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    await fill(tmp);
    if (existsSync(path)) rmSync(path, { recursive: true, force: true });
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}

/** A checkpoint's JSON file; damage (a cut-off write, a hand edit) is reported naming the file and the way out. */
export function readCheckpointJson<T>(path: string): T {
  let text: string;
  try { text = readFileSync(path, "utf8"); } catch (e) { throw new Error(`checkpoint: cannot read ${path}: ${(e as Error).message}`); }
  try {
    return JSON.parse(text) as T;
  } catch (e) {
    throw new Error(`checkpoint: ${path} is not valid JSON (${(e as Error).message}); the checkpoint is damaged: `
      + "resume from another step (trainer.resume_mode=resume_path trainer.resume_from_path=<.../global_step_N>) or remove this step's folder");
  }
}
