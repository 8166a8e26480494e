// Hub ids through the Hugging Face cache layout, against a local server that answers the Hub's routes
// (/api/{models,datasets}/<id>/revision/<rev>, /<id>/resolve/<rev>/<file>, LFS files redirected to a
// storage host with X-Linked-Etag/X-Linked-Size) and a cache folder laid out as huggingface_hub lays it out.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { execFile } from "node:child_process";
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readlinkSync, realpathSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { hubEnv, resolveModelPath, snapshotDownload, type HubEnv } from "../../src/utils/hf_hub.js";
import { rowsToParquetBytes, readParquet } from "../../src/data/parquet.js";

const MAIN = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));
const SHA = "0123456789abcdef0123456789abcdef01234567";
const sha256 = (b: Buffer) => createHash("sha256").update(b).digest("hex");

interface RepoFile { body: Buffer; lfs: boolean }
const weights = Buffer.alloc(300_000, 7);
for (let i = 0; i < weights.length; i++) weights[i] = (i * 31) & 255;
const gsmRows = (split: string, n: number) => Array.from({ length: n }, (_, i) => ({ question: `${split} q${i}: 2+${i}?`, answer: `2+${i}=${2 + i}\n#### ${2 + i}` }));
const REPOS: Record<string, Record<string, RepoFile>> = {
  "models/Org/Tiny": {
    "config.json": { body: Buffer.from('{"model_type":"llama"}'), lfs: false },
    "tokenizer.json": { body: Buffer.from('{"model":{}}'), lfs: false },
    "model.safetensors": { body: weights, lfs: true },
    "pytorch_model.bin": { body: Buffer.from("not wanted"), lfs: true },
  },
  "datasets/openai/gsm8k": {
    "main/train-00000-of-00001.parquet": { body: Buffer.from(rowsToParquetBytes(gsmRows("train", 5))), lfs: true },
    "main/test-00000-of-00001.parquet": { body: Buffer.from(rowsToParquetBytes(gsmRows("test", 3))), lfs: true },
    "socratic/test-00000-of-00001.parquet": { body: Buffer.from("other config"), lfs: true },
    "README.md": { body: Buffer.from("# gsm8k"), lfs: false },
  },
};

let server: Server;
let endpoint = "";
const seen: { method: string; url: string; range?: string; auth?: string }[] = [];
let corrupt = false;

function handle(req: IncomingMessage, res: import("node:http").ServerResponse): void {
  seen.push({ method: req.method!, url: req.url!, range: req.headers.range, auth: req.headers.authorization });
  const url = decodeURIComponent(req.url!);
  const api = /^\/api\/(models|datasets)\/(.+)\/revision\/main$/.exec(url);
  if (api) {
    const repo = REPOS[`${api[1]}/${api[2]}`];
    if (!repo) { res.writeHead(404).end(); return; }
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ sha: SHA, siblings: Object.keys(repo).map((rfilename) => ({ rfilename })) }));
    return;
  }
  const cdn = /^\/cdn\/([0-9a-f]{64})$/.exec(url);
  if (cdn) {
    const file = Object.values(REPOS).flatMap((r) => Object.values(r)).find((f) => sha256(f.body) === cdn[1]);
    if (!file) { res.writeHead(404).end(); return; }
    let body = corrupt ? Buffer.from(file.body).fill(0, 0, 10) : file.body;
    const range = /^bytes=(\d+)-$/.exec(req.headers.range ?? "");
    if (range) {
      const from = Number(range[1]);
      body = body.subarray(from);
      res.writeHead(206, { "content-range": `bytes ${from}-${file.body.length - 1}/${file.body.length}`, "content-length": body.length });
    } else res.writeHead(200, { "content-length": body.length });
    res.end(req.method === "HEAD" ? undefined : body);
    return;
  }
  const resolve = /^\/(datasets\/)?(.+?\/.+?)\/resolve\/([^/]+)\/(.+)$/.exec(url);
  if (resolve) {
    const repo = REPOS[`${resolve[1] ? "datasets" : "models"}/${resolve[2]}`];
    const file = repo?.[resolve[4]!];
    if (!file || resolve[3] !== SHA) { res.writeHead(404).end(); return; }
    if (file.lfs) {
      res.writeHead(302, { location: `${endpoint}/cdn/${sha256(file.body)}`, "x-linked-etag": `"${sha256(file.body)}"`, "x-linked-size": file.body.length, "x-repo-commit": SHA, etag: '"pointer"' }).end();
      return;
    }
    const etag = createHash("sha1").update(file.body).digest("hex");
    res.writeHead(200, { etag: `"${etag}"`, "content-length": file.body.length, "x-repo-commit": SHA });
    res.end(req.method === "HEAD" ? undefined : file.body);
    return;
  }
  res.writeHead(404).end();
}

before(async () => {
  server = createServer(handle);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const addr = server.address() as { port: number };
  endpoint = `http://127.0.0.1:${addr.port}`;
});
after(() => server.close());

function freshEnv(extra: Partial<HubEnv> = {}): HubEnv {
  return { endpoint, cacheDir: mkdtempSync(join(tmpdir(), "hf-cache-")), token: undefined, offline: false, ...extra };
}

test("hubEnv reads HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE as huggingface_hub does", () => {
  const e = hubEnv({ HOME: "/h", HF_HOME: "/x/hf", HF_ENDPOINT: "http://mirror/", HF_TOKEN: "t", HF_HUB_OFFLINE: "1" });
  assert.deepEqual(e, { endpoint: "http://mirror", cacheDir: "/x/hf/hub", token: "t", offline: true });
  assert.equal(hubEnv({ HF_HOME: "/x/hf", HF_HUB_CACHE: "/c" }).cacheDir, "/c");
  assert.equal(hubEnv({ HF_HOME: "/x/hf", HF_HUB_OFFLINE: "0" }).offline, false);
});

test("a model id downloads into models--Org--Name: blobs by etag, snapshot symlinks, refs/main; only the files a load reads", async () => {
  const env = freshEnv({ token: "hf_secret" });
  const snap = await snapshotDownload("model", "Org/Tiny", { allow: ["*.json", "*.safetensors"], env });
  const repo = join(env.cacheDir, "models--Org--Tiny");
  assert.equal(snap, join(repo, "snapshots", SHA));
  assert.equal(readFileSync(join(repo, "refs", "main"), "utf8"), SHA);
  assert.ok(lstatSync(join(snap, "model.safetensors")).isSymbolicLink());
  assert.equal(readlinkSync(join(snap, "model.safetensors")), join("..", "..", "blobs", sha256(weights)));
  assert.deepEqual(readFileSync(join(snap, "model.safetensors")), weights);
  assert.equal(readFileSync(join(snap, "config.json"), "utf8"), '{"model_type":"llama"}');
  assert.ok(existsSync(join(repo, "blobs", createHash("sha1").update('{"model_type":"llama"}').digest("hex"))));
  assert.ok(!existsSync(join(snap, "pytorch_model.bin")));
  // the token goes to the Hub, not to the storage host
  assert.ok(seen.filter((s) => s.url.startsWith("/api/") || s.url.includes("/resolve/")).every((s) => s.auth === "Bearer hf_secret"));
  // a second call reads the cache: no file is fetched again
  const before = seen.length;
  assert.equal(await snapshotDownload("model", "Org/Tiny", { allow: ["*.json", "*.safetensors"], env }), snap);
  assert.deepEqual(seen.slice(before).map((s) => s.url), ["/api/models/Org/Tiny/revision/main"]);
});

test("an interrupted download resumes from <blob>.incomplete with a Range request", async () => {
  const env = freshEnv();
  const blobs = join(env.cacheDir, "models--Org--Tiny", "blobs");
  mkdirSync(blobs, { recursive: true });
  writeFileSync(join(blobs, `${sha256(weights)}.incomplete`), weights.subarray(0, 100_000));
  const snap = await snapshotDownload("model", "Org/Tiny", { allow: ["model.safetensors"], env });
  assert.deepEqual(readFileSync(join(snap, "model.safetensors")), weights);
  assert.ok(seen.some((s) => s.url.startsWith("/cdn/") && s.range === "bytes=100000-"));
  assert.ok(!existsSync(join(blobs, `${sha256(weights)}.incomplete`)));
});

test("a file whose sha256 differs from X-Linked-Etag is refused and not cached", async () => {
  const env = freshEnv();
  corrupt = true;
  try {
    await assert.rejects(snapshotDownload("model", "Org/Tiny", { allow: ["model.safetensors"], env }), /model\.safetensors: sha256 [0-9a-f]{64} does not match the Hub's/);
  } finally {
    corrupt = false;
  }
  assert.ok(!existsSync(join(env.cacheDir, "models--Org--Tiny", "snapshots", SHA, "model.safetensors")));
});

test("HF_HUB_OFFLINE reads a cache laid out by huggingface_hub and never asks the server; a missing repo names the cache", async () => {
  const cacheDir = mkdtempSync(join(tmpdir(), "hf-py-cache-"));
  const repo = join(cacheDir, "models--Qwen--Qwen2.5-0.5B-Instruct");
  const commit = "7ae557604adf67be50417f59c2c2f167def9a775";
  mkdirSync(join(repo, "blobs"), { recursive: true });
  mkdirSync(join(repo, "refs"));
  mkdirSync(join(repo, "snapshots", commit), { recursive: true });
  writeFileSync(join(repo, "blobs", "abc"), '{"model_type":"qwen2"}');
  symlinkSync("../../blobs/abc", join(repo, "snapshots", commit, "config.json"));
  writeFileSync(join(repo, "refs", "main"), commit);
  const env: HubEnv = { endpoint: "http://127.0.0.1:9", cacheDir, token: undefined, offline: true };
  const before = seen.length;
  const p = await resolveModelPath("Qwen/Qwen2.5-0.5B-Instruct", "actor_rollout_ref.model.path", env);
  assert.equal(p, join(repo, "snapshots", commit));
  assert.equal(JSON.parse(readFileSync(join(p, "config.json"), "utf8")).model_type, "qwen2");
  assert.equal(seen.length, before);
  await assert.rejects(resolveModelPath("Qwen/Qwen3-8B", "actor_rollout_ref.model.path", env),
    new RegExp(`actor_rollout_ref\\.model\\.path=Qwen/Qwen3-8B: not a local path, and as a Hugging Face model id: model Qwen/Qwen3-8B@main is not in the Hugging Face cache \\(${cacheDir}/models--Qwen--Qwen3-8B\\) and HF_HUB_OFFLINE is set`));
  // a local path is never taken for an id; an unknown repo online is a 404 naming it
  assert.equal(await resolveModelPath(cacheDir, "k", env), cacheDir);
  await assert.rejects(resolveModelPath("Org/Nope", "critic.model.path", freshEnv()), /critic\.model\.path=Org\/Nope: .*model Org\/Nope@main: HTTP 404 \(no such repo/);
});

test("verl preprocess gsm8k without --local_dataset_path fetches openai/gsm8k (main/*.parquet) into datasets--openai--gsm8k", async () => {
  const home = mkdtempSync(join(tmpdir(), "hf-home-"));
  const out = join(home, "out");
  const env: NodeJS.ProcessEnv = { ...process.env, HF_HOME: join(home, "hf"), HF_ENDPOINT: endpoint, HOME: home };
  delete env.HF_HUB_OFFLINE;
  delete env.HF_HUB_CACHE;
  const r = await new Promise<{ code: number; stderr: string }>((res) =>
    execFile(process.execPath, [MAIN, "preprocess", "gsm8k", "--local_save_dir", out], { env }, (err, _o, stderr) => res({ code: err ? (err.code as number) : 0, stderr })));
  assert.equal(r.code, 0, r.stderr);
  const snap = join(home, "hf", "hub", "datasets--openai--gsm8k", "snapshots", SHA);
  assert.ok(lstatSync(join(snap, "main", "train-00000-of-00001.parquet")).isSymbolicLink());
  assert.ok(!existsSync(join(snap, "socratic")));
  assert.match(r.stderr, /openai\/gsm8k\/main\/train-00000-of-00001\.parquet: .*MiB/); // progress line (not a terminal)
  const train = await readParquet(join(out, "train.parquet"));
  assert.equal(train.length, 5);
  assert.equal((train[2]!.reward_model as { ground_truth: string }).ground_truth, "4");
  assert.equal((await readParquet(join(out, "test.parquet"))).length, 3);
  assert.ok(realpathSync(join(snap, "main", "test-00000-of-00001.parquet")).includes("/blobs/"));
});
