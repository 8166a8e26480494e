// Every fenced bash/sh block of README.md and docs/*.md runs as written (docs/contributing.md says how
// a block is marked skip or smoke). One temporary checkout per page: symlinks to this build's bin/,
// conf/, dist/, node_modules/ ..., ../shared beside it, HOME inside it, and `verl` on PATH; a page's
// blocks run in order in it, so a later block may use the files an earlier block made.
// `npm ci`, `npm run build` and `npm test` are .ci/run's own steps (this test is part of `npm test`):
// the npm on PATH here says so and returns; every other npm command is the real one.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { packageRoot, sharedDir } from "../../src/utils/paths.js";
import { parseDocBlocks, parseDocFiles, readDocBlocks, type DocBlock } from "./doc_blocks.js";

const PAGES = ["README.md", ...readdirSync(join(packageRoot, "docs")).filter((f) => f.endsWith(".md")).sort().map((f) => `docs/${f}`)];
const LINKED = ["bin", "conf", "dist", "node_modules", "package.json", "package-lock.json", "recipes", "scripts", "src", "test", "bench", "tsconfig.json", "docs", "README.md"];
const BLOCK_TIMEOUT_MS = 300_000;
const SHARED = existsSync(sharedDir()) ? sharedDir() : undefined;

function realNpm(): string {
  const r = spawnSync("bash", ["-c", "command -v npm"], { encoding: "utf8" });
  return r.stdout.trim() || "npm";
}

/** A checkout-shaped temp folder for one page; returns its paths. */
function makeCheckout(): { root: string; cwd: string; env: NodeJS.ProcessEnv } {
  const root = mkdtempSync(join(tmpdir(), "doc-test-"));
  const cwd = join(root, "verl-ts");
  mkdirSync(cwd);
  for (const name of LINKED) if (existsSync(join(packageRoot, name))) symlinkSync(join(packageRoot, name), join(cwd, name));
  if (SHARED) symlinkSync(SHARED, join(root, "shared"));
  const home = join(root, "home");
  const shim = join(root, "shim");
  mkdirSync(home);
  mkdirSync(shim);
  writeFileSync(join(shim, "verl"), `#!/usr/bin/env bash\nexec node ${JSON.stringify(join(packageRoot, "bin", "verl.js"))} "$@"\n`);
  writeFileSync(join(shim, "npm"), `#!/usr/bin/env bash
case "$*" in
  ci|ci\\ *|"run build"|test|test\\ *) echo "doc-test: 'npm $*' is a step of .ci/run itself; not repeated here" >&2; exit 0 ;;
esac
exec ${JSON.stringify(realNpm())} "$@"
`);
  chmodSync(join(shim, "verl"), 0o755);
  chmodSync(join(shim, "npm"), 0o755);
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, PATH: `${shim}:${process.env.PATH ?? ""}`, npm_config_cache: join(process.env.HOME ?? home, ".npm") };
  delete env.VERL_TEST;
  return { root, cwd, env };
}

function runBlock(block: DocBlock, cwd: string, env: NodeJS.ProcessEnv): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn("bash", ["--noprofile", "--norc", "-eo", "pipefail", "-c", block.code], {
      cwd, env: { ...env, ...block.smoke }, stdio: ["ignore", "pipe", "pipe"], detached: true,
    });
    let output = "";
    const keep = (d: Buffer) => { output = (output + d.toString()).slice(-20_000); };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    const timer = setTimeout(() => { output += `\n[doc-test: killed after ${BLOCK_TIMEOUT_MS / 1000} s]`; process.kill(-child.pid!, "SIGKILL"); }, BLOCK_TIMEOUT_MS);
    child.on("close", (code) => { clearTimeout(timer); resolve({ code, output }); });
  });
}

test("doc-test directives: skip needs a reason, smoke takes VAR=VALUE, anything else is an error", () => {
  const md = "a\n<!-- doc-test: skip needs a GPU -->\n```bash\nnvidia-smi\n```\n\n<!-- doc-test: smoke SMOKE=1 STEPS=2 -->\n\n```sh\nbash x.sh\n```\n```ts\nnot shell\n```\n```bash\necho hi\n```\n";
  const blocks = parseDocBlocks("x.md", md);
  assert.equal(blocks.length, 3);
  assert.equal(blocks[0]!.skip, "needs a GPU");
  assert.deepEqual(blocks[1]!.smoke, { SMOKE: "1", STEPS: "2" });
  assert.equal(blocks[1]!.line, 9);
  assert.equal(blocks[2]!.skip, undefined);
  const files = parseDocFiles("x.md", "```js\n// my_algos.mjs\nexport {};\n```\n```python\n# my_reward.py, unchanged\nx = 1\n```\n```js\nimport 'a';\n```\n");
  assert.deepEqual(files.map((f) => [f.name, f.text]), [["my_algos.mjs", "// my_algos.mjs\nexport {};\n"], ["my_reward.py", "# my_reward.py, unchanged\nx = 1\n"]]);
  assert.throws(() => parseDocBlocks("x.md", "<!-- doc-test: skip -->\n```bash\nls\n```\n"), /x\.md:1: .*needs a reason/);
  assert.throws(() => parseDocBlocks("x.md", "<!-- doc-test: smok A=1 -->\n```bash\nls\n```\n"), /unknown doc-test directive 'smok'/);
  assert.throws(() => parseDocBlocks("x.md", "<!-- doc-test: smoke 1A=2 -->\n```bash\nls\n```\n"), /VAR=VALUE pairs, got '1A=2'/);
});

for (const page of PAGES) {
  const blocks = readDocBlocks(join(packageRoot, page), page);
  if (blocks.length === 0) continue;
  const needsShared = blocks.some((b) => !b.skip && /\.\.\/shared|\$SHARED|stories260K|gsm8k/.test(b.code));
  const skipPage = needsShared && !SHARED ? `${page}: ../shared is absent (its blocks read models or data from it)` : false;
  describe(`${page} commands run as written`, { skip: skipPage }, () => {
    let box: ReturnType<typeof makeCheckout> | undefined;
    for (const block of blocks) {
      const name = `${page}:${block.line}${Object.keys(block.smoke).length ? ` (smoke ${Object.entries(block.smoke).map(([k, v]) => `${k}=${v}`).join(" ")})` : ""}`;
      test(name, { skip: block.skip ? `doc-test: skip ${block.skip}` : false, timeout: BLOCK_TIMEOUT_MS + 10_000 }, async () => {
        if (!box) {
          box = makeCheckout();
          for (const f of parseDocFiles(page, readFileSync(join(packageRoot, page), "utf8"))) {
            mkdirSync(dirname(join(box.cwd, f.name)), { recursive: true });
            writeFileSync(join(box.cwd, f.name), f.text);
          }
        }
        const r = await runBlock(block, box.cwd, box.env);
        assert.equal(r.code, 0, `${page}:${block.line} exited ${r.code}:\n${block.code}\n--- output (tail) ---\n${r.output.slice(-4000)}`);
      });
    }
    test(`${page}: clean up`, () => { if (box) rmSync(box.root, { recursive: true, force: true }); });
  });
}
