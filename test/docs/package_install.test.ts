// verl-ts as a library from the user's own folder: `npm pack` this build, `npm install` the tarball
// into a fresh project (dependencies from npm's cache, the registry only for what it lacks), then
// docs/extending.md's example (its my_algos.mjs and its verl train command) runs there as written.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { packageRoot } from "../../src/utils/paths.js";
import { parseDocBlocks, parseDocFiles } from "./doc_blocks.js";

function sh(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = process.env, timeout = 300_000): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((res) => execFile(cmd, args, { cwd, env, timeout, maxBuffer: 64 << 20 }, (err, stdout, stderr) =>
    res({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, stdout, stderr })));
}

const built = existsSync(join(packageRoot, "dist", "src", "index.js"));

test("npm pack, npm install the tarball in a new project, and docs/extending.md's example runs from there", { skip: built ? false : "dist/ is not built", timeout: 600_000 }, async () => {
  const root = mkdtempSync(join(tmpdir(), "verl-user-"));
  try {
    const pack = await sh("npm", ["pack", "--json", "--pack-destination", root], packageRoot);
    assert.equal(pack.code, 0, pack.stderr);
    const info = JSON.parse(pack.stdout) as { filename: string; files: { path: string }[] }[];
    const tarball = join(root, info[0]!.filename);
    const files = info[0]!.files.map((f) => f.path);
    assert.ok(files.includes("dist/src/index.js") && files.includes("conf/ppo_trainer.yaml") && files.includes("src/reward/python/runner.py"));
    assert.ok(files.includes("src/data/python/bridge.py") && files.includes("src/data/python/shim/verl/experimental/dataset/sampler.py"), "the Python data bridge ships");
    assert.ok(!files.some((f) => f.startsWith("dist/test/") || f.startsWith("test/")), "tests are not packed");

    const project = join(root, "my-project");
    await sh("mkdir", ["-p", project], root);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "my-project", private: true, type: "module" }));
    // npm's cache first (CI's npm ci filled it); optional GPU packages left out to keep it quick.
    const install = await sh("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", "--omit=optional", tarball], project);
    assert.equal(install.code, 0, install.stderr);

    const page = readFileSync(join(packageRoot, "docs", "extending.md"), "utf8");
    for (const f of parseDocFiles("docs/extending.md", page)) writeFileSync(join(project, f.name), f.text);
    assert.ok(existsSync(join(project, "my_algos.mjs")));
    const block = parseDocBlocks("docs/extending.md", page).find((b) => !b.skip && b.code.includes("external_lib=./my_algos.mjs"));
    assert.ok(block, "docs/extending.md has the verl train block");
    const env: NodeJS.ProcessEnv = { ...process.env, PATH: `${join(project, "node_modules", ".bin")}:${process.env.PATH ?? ""}` };
    delete env.VERL_TEST;
    const run = await sh("bash", ["-eo", "pipefail", "-c", block.code], project, env);
    assert.equal(run.code, 0, `${run.stderr.slice(-3000)}`);
    assert.match(run.stdout, /^step:2 - /m);
    // the run used the installed package, not this checkout
    assert.ok(existsSync(join(project, "node_modules", "verl-ts", "dist", "src", "index.js")));
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
