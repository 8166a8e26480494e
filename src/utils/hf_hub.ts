// Hugging Face Hub ids (`Qwen/Qwen2.5-0.5B-Instruct`, `openai/gsm8k`) as verl's users write them:
// resolved through the cache that huggingface_hub keeps (HF_HOME, HF_HUB_CACHE; <cache>/models--Org--Name/
// {refs/<revision>, snapshots/<commit>/<file> -> ../../blobs/<etag>}), else downloaded from HF_ENDPOINT
// (with HF_TOKEN) into that same layout, so Python and verl-ts share one cache. HF_HUB_OFFLINE=1 reads
// the cache only. Downloads resume (<blob>.incomplete + a Range request) and LFS files are checked
// against their sha256 (the X-Linked-Etag the Hub sends for them).
import { createHash } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, openSync, closeSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync, writeSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join, relative } from "node:path";

export type RepoType = "model" | "dataset";

export interface HubEnv {
  endpoint: string;
  cacheDir: string;
  token: string | undefined;
  offline: boolean;
}

const TRUE = new Set(["1", "on", "yes", "true"]);

/** huggingface_hub's constants, read from the environment as it reads them. */
export function hubEnv(env: NodeJS.ProcessEnv = process.env): HubEnv {
  const hfHome = env.HF_HOME ?? join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "huggingface");
  const cacheDir = env.HF_HUB_CACHE ?? env.HUGGINGFACE_HUB_CACHE ?? join(hfHome, "hub");
  let token = env.HF_TOKEN ?? env.HUGGING_FACE_HUB_TOKEN;
  if (!token) {
    const file = env.HF_TOKEN_PATH ?? join(hfHome, "token");
    if (existsSync(file)) token = readFileSync(file, "utf8").trim() || undefined;
  }
  return {
    endpoint: (env.HF_ENDPOINT ?? "https://huggingface.co").replace(/\/+$/, ""),
    cacheDir,
    token,
    offline: TRUE.has(String(env.HF_HUB_OFFLINE ?? "").toLowerCase()),
  };
}

/** `Org/Name` with the Hub's characters; a path that exists locally is never taken for one. */
export function looksLikeRepoId(s: string): boolean {
  return /^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*$/.test(s) && !s.includes("..") && !s.startsWith(".");
}

export function repoFolder(env: HubEnv, type: RepoType, repoId: string): string {
  return join(env.cacheDir, `${type}s--${repoId.replace(/\//g, "--")}`);
}

/** The cached snapshot folder of `revision` (a branch/tag via refs/, or a commit hash), or undefined. */
export function cachedSnapshot(env: HubEnv, type: RepoType, repoId: string, revision = "main"): string | undefined {
  const repo = repoFolder(env, type, repoId);
  const ref = join(repo, "refs", revision);
  const commit = existsSync(ref) ? readFileSync(ref, "utf8").trim() : /^[0-9a-f]{40}$/.test(revision) ? revision : undefined;
  if (!commit) return undefined;
  const snap = join(repo, "snapshots", commit);
  return existsSync(snap) ? snap : undefined;
}

export class HubError extends Error {}

function urlPrefix(env: HubEnv, type: RepoType, repoId: string): string {
  return `${env.endpoint}/${type === "dataset" ? "datasets/" : ""}${repoId}`;
}

function headers(env: HubEnv, extra: Record<string, string> = {}): Record<string, string> {
  return { "user-agent": "verl-ts (huggingface_hub-compatible)", ...(env.token ? { authorization: `Bearer ${env.token}` } : {}), ...extra };
}

function httpError(what: string, status: number, env: HubEnv): HubError {
  const hint = status === 401 || status === 403
    ? env.token ? " (HF_TOKEN was sent: is the repo gated, and is access granted to this token?)" : " (gated or private: set HF_TOKEN)"
    : status === 404 ? " (no such repo, revision or file)" : "";
  return new HubError(`${what}: HTTP ${status}${hint}`);
}

async function request(url: string, init: RequestInit, what: string): Promise<Response> {
  try {
    return await fetch(url, init);
  } catch (e) {
    const cause = (e as { cause?: { code?: string; message?: string } }).cause;
    throw new HubError(`${what}: cannot reach ${new URL(url).origin} (${cause?.code ?? cause?.message ?? (e as Error).message}); set HF_ENDPOINT for a mirror, or HF_HUB_OFFLINE=1 to use the cache only`);
  }
}

/** The Hub's revision info: its commit and the files it holds (/api/{models,datasets}/<id>/revision/<rev>). */
async function revisionInfo(env: HubEnv, type: RepoType, repoId: string, revision: string): Promise<{ sha: string; files: string[] }> {
  const url = `${env.endpoint}/api/${type}s/${repoId}/revision/${encodeURIComponent(revision)}`;
  const what = `${type} ${repoId}@${revision}`;
  const res = await request(url, { headers: headers(env) }, what);
  if (!res.ok) throw httpError(what, res.status, env);
  const body = (await res.json()) as { sha?: unknown; siblings?: { rfilename?: unknown }[] };
  if (typeof body.sha !== "string" || !Array.isArray(body.siblings)) throw new HubError(`${what}: ${url} answered without sha/siblings`);
  return { sha: body.sha, files: body.siblings.map((s) => s.rfilename).filter((f): f is string => typeof f === "string") };
}

interface FileMeta { etag: string; size: number | undefined; commit: string | undefined; lfs: boolean; location: string }

/** HEAD on the resolve route, following the Hub's relative redirects (a renamed repo) but not a CDN's. */
async function fileMeta(env: HubEnv, url: string, what: string): Promise<FileMeta> {
  let location = url;
  for (let hop = 0; hop < 5; hop++) {
    const res = await request(location, { method: "HEAD", redirect: "manual", headers: headers(env, { "accept-encoding": "identity" }) }, what);
    const linked = res.headers.get("x-linked-etag");
    const etag = (linked ?? res.headers.get("etag") ?? "").replace(/^W\//, "").replace(/"/g, "");
    if (res.status >= 300 && res.status < 400) {
      const next = res.headers.get("location");
      if (!next) throw new HubError(`${what}: redirect without a location`);
      // An LFS file redirects to its storage: the metadata is in this response.
      if (etag && linked) {
        const size = Number(res.headers.get("x-linked-size") ?? NaN);
        return { etag, size: Number.isFinite(size) ? size : undefined, commit: res.headers.get("x-repo-commit") ?? undefined, lfs: true, location: new URL(next, location).href };
      }
      location = new URL(next, location).href;
      continue;
    }
    if (!res.ok) throw httpError(what, res.status, env);
    if (!etag) throw new HubError(`${what}: the server sent no ETag, so the file cannot be cached`);
    const size = Number(res.headers.get("x-linked-size") ?? res.headers.get("content-length") ?? NaN);
    return { etag, size: Number.isFinite(size) ? size : undefined, commit: res.headers.get("x-repo-commit") ?? undefined, lfs: linked !== null, location };
  }
  throw new HubError(`${what}: too many redirects`);
}

async function sha256File(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest("hex");
}

/** Progress of one download on stderr: a bar on a terminal, a line every 25% otherwise. */
function byteProgress(label: string, total: number | undefined, start: number): (done: number, end?: boolean) => void {
  const tty = Boolean(process.stderr.isTTY);
  let last = 0;
  let nextPct = 25;
  const mb = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;
  return (done, end = false) => {
    const now = Date.now();
    const pct = total ? Math.floor((100 * done) / total) : 0;
    const rate = done / Math.max(0.001, (now - start) / 1000);
    if (tty) {
      if (!end && now - last < 100) return;
      last = now;
      const width = 24;
      const fill = total ? Math.round((width * done) / total) : 0;
      process.stderr.write(`\r${label} [${"#".repeat(fill)}${".".repeat(width - fill)}] ${mb(done)}${total ? `/${mb(total)}` : ""} ${mb(rate)}/s\x1b[K${end ? "\n" : ""}`);
    } else if (end || (total && pct >= nextPct)) {
      process.stderr.write(`${label}: ${mb(done)}${total ? `/${mb(total)} (${pct}%)` : ""}, ${mb(rate)}/s\n`);
      while (pct >= nextPct) nextPct += 25;
    }
  };
}

/** Download `url` into `blob`, resuming from `<blob>.incomplete`; checks the size and (LFS) the sha256. */
async function downloadBlob(env: HubEnv, meta: FileMeta, blob: string, label: string): Promise<void> {
  const part = `${blob}.incomplete`;
  mkdirSync(dirname(blob), { recursive: true });
  let have = existsSync(part) ? statSync(part).size : 0;
  if (meta.size !== undefined && have > meta.size) { rmSync(part); have = 0; }
  const init: RequestInit = { headers: headers(env, have > 0 ? { range: `bytes=${have}-` } : {}) };
  // A CDN location is fetched without the token, as huggingface_hub does for other hosts.
  if (new URL(meta.location).origin !== new URL(env.endpoint).origin) init.headers = have > 0 ? { range: `bytes=${have}-` } : {};
  const res = await request(meta.location, init, label);
  if (res.status === 416 && meta.size !== undefined && have === meta.size) {
    // already complete
  } else {
    if (!res.ok) throw httpError(label, res.status, env);
    if (have > 0 && res.status !== 206) have = 0; // the server ignored Range: start over
    const fd = openSync(part, have > 0 ? "a" : "w");
    const start = Date.now();
    const show = byteProgress(label, meta.size, start);
    let done = have;
    try {
      if (!res.body) throw new HubError(`${label}: empty response`);
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        writeSync(fd, chunk);
        done += chunk.length;
        show(done);
      }
      show(done, true);
    } finally {
      closeSync(fd);
    }
  }
  const size = statSync(part).size;
  if (meta.size !== undefined && size !== meta.size) throw new HubError(`${label}: got ${size} bytes, expected ${meta.size} (run again to resume)`);
  if (meta.lfs && /^[0-9a-f]{64}$/.test(meta.etag)) {
    const sum = await sha256File(part);
    if (sum !== meta.etag) {
      rmSync(part);
      throw new HubError(`${label}: sha256 ${sum} does not match the Hub's ${meta.etag}; the partial file was removed, run again`);
    }
  }
  renameSync(part, blob);
}

function pointTo(pointer: string, blob: string): void {
  mkdirSync(dirname(pointer), { recursive: true });
  rmSync(pointer, { force: true });
  try {
    symlinkSync(relative(dirname(pointer), blob), pointer);
  } catch {
    writeFileSync(pointer, readFileSync(blob)); // no symlinks here: a copy, as huggingface_hub falls back to
  }
}

function writeRef(repo: string, revision: string, commit: string): void {
  if (revision === commit) return;
  const ref = join(repo, "refs", revision);
  mkdirSync(dirname(ref), { recursive: true });
  writeFileSync(`${ref}.tmp`, commit);
  renameSync(`${ref}.tmp`, ref);
}

/** Glob of huggingface_hub's allow_patterns kind: `*` within a name, `**` across folders. */
function globMatch(pattern: string, name: string): boolean {
  const re = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*\*/g, "\u0000").replace(/\*/g, "[^/]*").replace(/\u0000/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${re}$`).test(name);
}

/** `allow`: patterns, or patterns chosen from the revision's file list (modelFiles picks the weights' format). */
export interface SnapshotOptions { revision?: string; allow?: string[] | ((files: string[]) => string[]); env?: HubEnv }

/**
 * The local folder of a Hub repo at a revision (snapshot_download): the cache's copy when it is there
 * and offline (or the Hub is unreachable), else the files matching `allow` downloaded into the cache.
 */
export async function snapshotDownload(type: RepoType, repoId: string, opts: SnapshotOptions = {}): Promise<string> {
  const env = opts.env ?? hubEnv();
  const revision = opts.revision ?? "main";
  const repo = repoFolder(env, type, repoId);
  const cached = cachedSnapshot(env, type, repoId, revision);
  if (env.offline) {
    if (cached) return cached;
    throw new HubError(`${type} ${repoId}@${revision} is not in the Hugging Face cache (${repo}) and HF_HUB_OFFLINE is set; download it once with HF_HUB_OFFLINE unset, or give a local path`);
  }
  let info: { sha: string; files: string[] };
  try {
    info = await revisionInfo(env, type, repoId, revision);
  } catch (e) {
    if (cached && e instanceof HubError && /cannot reach/.test(e.message)) {
      process.stderr.write(`${e.message}; using the cached snapshot ${cached}\n`);
      return cached;
    }
    throw e;
  }
  const allow = typeof opts.allow === "function" ? opts.allow(info.files) : opts.allow;
  const wanted = info.files.filter((f) => !allow || allow.some((p) => globMatch(p, f)));
  if (wanted.length === 0) throw new HubError(`${type} ${repoId}@${revision} has no files matching ${allow?.join(", ")}`);
  const snap = join(repo, "snapshots", info.sha);
  for (const file of wanted) {
    const pointer = join(snap, file);
    if (existsSync(pointer)) continue;
    const url = `${urlPrefix(env, type, repoId)}/resolve/${info.sha}/${file.split("/").map(encodeURIComponent).join("/")}`;
    const label = `${repoId}/${file}`;
    const meta = await fileMeta(env, url, label);
    const blob = join(repo, "blobs", meta.etag);
    if (!existsSync(blob)) await downloadBlob(env, meta, blob, label);
    pointTo(pointer, blob);
  }
  writeRef(repo, revision, info.sha);
  return snap;
}

/** The files a verl-ts model load reads: config, safetensors weights, tokenizer and chat template. */
export const MODEL_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja", "*.tiktoken"];

/**
 * MODEL_FILES, plus the pytorch_model*.bin weights of a repository that has no model*.safetensors
 * (older checkpoints; safetensors is preferred when a repository has both, as transformers prefers it).
 */
export function modelFiles(files: string[]): string[] {
  const safetensors = files.some((f) => /^model(-\d+-of-\d+)?\.safetensors$/.test(f));
  return safetensors ? MODEL_FILES : [...MODEL_FILES, "pytorch_model*.bin"];
}

/**
 * A model path as verl's users write it: an existing local path stays as it is; `Org/Name` (optionally
 * `Org/Name@revision`) becomes the cached or downloaded snapshot folder. Anything else is returned
 * unchanged for the loaders to report.
 */
export async function resolveModelPath(path: string, key: string, env: HubEnv = hubEnv()): Promise<string> {
  const [id, revision] = path.split("@") as [string, string | undefined];
  if (existsSync(path) || !looksLikeRepoId(id)) return path;
  try {
    return await snapshotDownload("model", id, { revision, allow: modelFiles, env });
  } catch (e) {
    if (e instanceof HubError) throw new HubError(`${key}=${path}: not a local path, and as a Hugging Face model id: ${e.message}`);
    throw e;
  }
}
