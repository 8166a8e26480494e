// reward_model.sandbox_fusion end to end: a Sandbox Fusion run_code service on 127.0.0.1 (started here)
// that really runs the submitted Python with python3, as the service's documented API does: POST
// {code, stdin, language, compile_timeout, run_timeout, memory_limit_MB, files, fetch_files} ->
// {status: Success|Failed|SandboxError, message, compile_result, run_result: {status, execution_time,
// return_code, stdout, stderr}, files}.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadRewardManager } from "../../src/reward/load.js";
import { extractCode, judgeRunCode, parseTestCases, pyStr, sandboxSettings, type RunCodeRequest } from "../../src/reward/sandbox_fusion.js";
import { makeBatch, rowSums } from "./helpers.js";

// printable ASCII and newline: enough to carry Python code through the tokenizer
const tok = new CharTokenizer(["\n", ...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i))]);

let server: Server;
let url = "";
let work = "";
const requests: RunCodeRequest[] = [];
let inFlight = 0, maxInFlight = 0;
const flaky = new Set<string>();

function runPython(req: RunCodeRequest): Promise<Record<string, unknown>> {
  const file = join(work, `case-${requests.length}-${Math.random().toString(36).slice(2)}.py`);
  writeFileSync(file, req.code);
  const started = performance.now();
  return new Promise((resolve) => {
    // memory_limit_MB as the address-space limit of the run, run_timeout as a kill
    const child = spawn("bash", ["-c", `ulimit -v ${req.memory_limit_MB * 1024}; exec python3 "$0"`, file], { stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "", stderr = "", timedOut = false;
    const timer = setTimeout(() => { timedOut = true; child.kill("SIGKILL"); }, req.run_timeout * 1000);
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.on("close", (code) => {
      clearTimeout(timer);
      const run = { status: timedOut ? "TimeLimitExceeded" : "Finished", execution_time: (performance.now() - started) / 1000, return_code: timedOut ? null : code, stdout, stderr };
      resolve({ status: !timedOut && code === 0 ? "Success" : "Failed", message: "", compile_result: null, run_result: run, executor_pod_name: null, files: {} });
    });
    child.stdin.end(req.stdin ?? "");
  });
}

before(async () => {
  work = mkdtempSync(join(tmpdir(), "verl-sandbox-"));
  server = createServer((req, res) => {
    let body = "";
    req.on("data", (d: Buffer) => (body += d.toString()));
    req.on("end", () => {
      void (async () => {
        if (req.method !== "POST" || req.url !== "/run_code") {
          res.writeHead(404).end("not found");
          return;
        }
        const r = JSON.parse(body) as RunCodeRequest;
        requests.push(r);
        // a gateway timeout the first time a marked program arrives (verl retries 504s)
        if (r.code.includes("# flaky-504") && !flaky.has(r.code)) {
          flaky.add(r.code);
          res.writeHead(504).end("gateway timeout");
          return;
        }
        if (r.code.includes("# server-500")) {
          res.writeHead(500).end("internal error");
          return;
        }
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        try {
          const out = r.language === "python" ? await runPython(r) : { status: "SandboxError", message: `language ${r.language}` };
          res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(out));
        } finally {
          inFlight--;
        }
      })();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/run_code`;
});

after(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
  rmSync(work, { recursive: true, force: true });
});

const config = (extra: string[] = [], manager = "naive") => loadConfig({
  configName: "ppo_trainer",
  overrides: [`reward_model.sandbox_fusion.url=${url}`, `reward_model.reward_manager=${manager}`, ...extra],
});
const py = (code: string) => "Here is my solution:\n```python\n" + code + "\n```\nDone.";

test("code data sources are scored by running the response's code on the sandbox; the others keep their built-in scorers", async () => {
  requests.length = 0;
  const mgr = await loadRewardManager(config(["reward_model.sandbox_fusion.memory_limit_mb=512"]), tok, { numExamine: 0 });
  const sum = "a, b = map(int, input().split())\nprint(a + b)";
  const rows = [
    { prompt: "p", response: py(sum), dataSource: "codecontests", groundTruth: JSON.stringify({ inputs: ["1 2\n", "3 4\n"], outputs: ["3\n", "7\n"] }) },
    { prompt: "p", response: py(sum), dataSource: "apps", groundTruth: { inputs: ["1 2", "3 4"], outputs: ["3", "8"] } },
    { prompt: "p", response: "```\ndef add(a, b):\n    return a + b\n```", dataSource: "taco", groundTruth: { fn_name: "add", inputs: ["1\n2", "5\n5"], outputs: ["3", "10"] } },
    { prompt: "p", response: py("raise ValueError('boom')"), dataSource: "codeforces", groundTruth: { inputs: [""], outputs: ["x"] } },
    { prompt: "p", response: "no code here", dataSource: "codecontests", groundTruth: { inputs: [""], outputs: [""] } },
    { prompt: "p", response: "#### 2", dataSource: "openai/gsm8k", groundTruth: "2" },
    { prompt: "p", response: py("def f(x):\n    return 2 * x"), dataSource: "apps", groundTruth: { assert_case: ["assert f(2) == 4", "assert f(3) == 7"] } },
  ];
  const { rewardTensor } = await mgr.compute(makeBatch(tok, rows, 2, 200));
  assert.deepEqual(rowSums(rewardTensor), [1, 0.5, 1, 0, 0, 1, 0.5]);
  // one request per test case (none for the row without a code block, none for gsm8k), in run_code's documented form
  assert.equal(requests.length, 2 + 2 + 2 + 1 + 2);
  for (const r of requests) {
    assert.deepEqual({ language: r.language, compile_timeout: r.compile_timeout, run_timeout: r.run_timeout, memory_limit_MB: r.memory_limit_MB, files: r.files, fetch_files: r.fetch_files },
      { language: "python", compile_timeout: 10, run_timeout: 10, memory_limit_MB: 512, files: {}, fetch_files: [] });
  }
  assert.ok(requests.some((r) => r.stdin === "1 2\n" && r.code.startsWith("\na, b = map(int")));
  assert.ok(requests.some((r) => r.code.includes("def add(a, b)") && r.stdin === "5\n5"));
  assert.ok(requests.some((r) => r.code.endsWith("\n\nassert f(3) == 7")));
});

test("max_concurrent bounds the requests in flight over the whole manager (naive and prime)", async () => {
  const slow = py("import time\ntime.sleep(0.4)\nprint('ok')");
  const gt = { inputs: ["", "", ""], outputs: ["ok", "ok", "ok"] };
  for (const manager of ["naive", "prime"]) {
    maxInFlight = 0;
    const mgr = await loadRewardManager(config(["reward_model.sandbox_fusion.max_concurrent=2"], manager), tok, { numExamine: 0 });
    try {
      const rows = [0, 1].map(() => ({ prompt: "p", response: slow, dataSource: "codecontests", groundTruth: gt }));
      const { rewardTensor } = await mgr.compute(makeBatch(tok, rows, 2, 200));
      assert.deepEqual(rowSums(rewardTensor), [1, 1], manager);
      assert.equal(maxInFlight, 2, `${manager}: ${maxInFlight} requests in flight at once`);
    } finally {
      await mgr.close?.();
    }
  }
});

test("memory_limit_mb reaches the sandbox: a program past it fails its case", async () => {
  const hog = py("x = bytearray(400 * 1024 * 1024)\nprint('done')");
  const rows = [{ prompt: "p", response: hog, dataSource: "codecontests", groundTruth: { inputs: [""], outputs: ["done"] } }];
  const tight = await loadRewardManager(config(["reward_model.sandbox_fusion.memory_limit_mb=128"]), tok, { numExamine: 0 });
  assert.deepEqual(rowSums((await tight.compute(makeBatch(tok, rows, 2, 200))).rewardTensor), [0]);
  const roomy = await loadRewardManager(config(["reward_model.sandbox_fusion.memory_limit_mb=2048"]), tok, { numExamine: 0 });
  assert.deepEqual(rowSums((await roomy.compute(makeBatch(tok, rows, 2, 200))).rewardTensor), [1]);
});

test("a 504 is retried; another HTTP error or an unreachable service scores the case as failed without stopping the run", async () => {
  requests.length = 0;
  const mgr = await loadRewardManager(config(), tok, { numExamine: 0 });
  const rows = [
    { prompt: "p", response: py("# flaky-504\nprint(1)"), dataSource: "codecontests", groundTruth: { inputs: [""], outputs: ["1"] } },
    { prompt: "p", response: py("# server-500\nprint(1)"), dataSource: "codecontests", groundTruth: { inputs: [""], outputs: ["1"] } },
  ];
  assert.deepEqual(rowSums((await mgr.compute(makeBatch(tok, rows, 2, 200))).rewardTensor), [1, 0]);
  assert.equal(requests.filter((r) => r.code.includes("flaky-504")).length, 2);
  assert.equal(requests.filter((r) => r.code.includes("server-500")).length, 1);
  // nothing listens on this port once the server is gone: a connection error scores 0
  const dead = createServer();
  await new Promise<void>((resolve) => dead.listen(0, "127.0.0.1", resolve));
  const deadPort = (dead.address() as AddressInfo).port;
  await new Promise<void>((resolve) => dead.close(() => resolve()));
  const offline = await loadRewardManager(loadConfig({ configName: "ppo_trainer", overrides: [`reward_model.sandbox_fusion.url=http://127.0.0.1:${deadPort}/run_code`] }), tok, { numExamine: 0 });
  assert.deepEqual(rowSums((await offline.compute(makeBatch(tok, rows.slice(0, 1), 2, 200))).rewardTensor), [0]);
});

test("a custom reward function wins over the sandbox, as in verl", async () => {
  requests.length = 0;
  const file = join(work, "reward.mjs");
  writeFileSync(file, "export function compute_score() { return 0.25; }\n");
  const mgr = await loadRewardManager(config([`custom_reward_function.path=${file}`]), tok, { numExamine: 0 });
  try {
    const rows = [{ prompt: "p", response: py("print(1)"), dataSource: "codecontests", groundTruth: { inputs: [""], outputs: ["1"] } }];
    assert.deepEqual(rowSums((await mgr.compute(makeBatch(tok, rows, 2, 200))).rewardTensor), [0.25]);
    assert.equal(requests.length, 0);
  } finally {
    await mgr.close?.();
  }
});

test("sandbox_fusion settings: bad values are errors naming the key", () => {
  const cfg = (o: string[]) => loadConfig({ configName: "ppo_trainer", overrides: o });
  assert.equal(sandboxSettings(cfg([])), null);
  assert.throws(() => sandboxSettings(cfg(["reward_model.sandbox_fusion.url=not a url"])), /reward_model\.sandbox_fusion\.url=not a url is not a URL/);
  assert.throws(() => sandboxSettings(cfg(["reward_model.sandbox_fusion.url=ftp://h/run_code"])), /sandbox_fusion\.url=ftp:\/\/h\/run_code: only http and https/);
  assert.throws(() => sandboxSettings(cfg(["reward_model.sandbox_fusion.url=http://h/run_code", "reward_model.sandbox_fusion.max_concurrent=0"])), /reward_model\.sandbox_fusion\.max_concurrent must be a positive integer/);
  assert.deepEqual(sandboxSettings(cfg(["reward_model.sandbox_fusion.url=http://h/run_code"])), { url: "http://h/run_code", maxConcurrent: 64, memoryLimitMb: 1024 });
});

test("verl's rules: code extraction, test-case shapes, and the status of each run_code answer", () => {
  assert.equal(extractCode("a\n```python\nx=1\n```\nb\n```python\ny=2\n```"), "\ny=2\n");
  assert.equal(extractCode("```cpp\nint main(){}\n```"), "int main(){}\n");
  // verl drops a language line only when it names one: after a bare fence the newline stays
  assert.equal(extractCode("```\nprint(1)\n```"), "\nprint(1)\n");
  assert.equal(extractCode("print(1)"), null);
  assert.deepEqual(parseTestCases({ assert_case: ["assert 1"] }), { inputs: [""], outputs: [null], assert_case: ["assert 1"] });
  assert.equal(typeof parseTestCases("{not json"), "string");
  assert.equal(typeof parseTestCases({ inputs: [] }), "string");
  const run = (status: string, rc: number | null, stdout = "") => ({ status, return_code: rc, stdout, stderr: "" });
  assert.equal(judgeRunCode({ status: "Success", run_result: run("Finished", 0, "7\n\n") }, "7").result, true);
  assert.equal(judgeRunCode({ status: "Success", run_result: run("Finished", 0, "7") }, "8").result, false);
  assert.equal(judgeRunCode({ status: "Success", run_result: run("Finished", 0, "anything") }, null).result, true);
  assert.equal(judgeRunCode({ status: "Failed", compile_result: { status: "Finished", return_code: 1 }, run_result: null }, "x").result, -4);
  assert.equal(judgeRunCode({ status: "Failed", compile_result: { status: "TimeLimitExceeded" }, run_result: null }, "x").status, "compile_timeout");
  assert.equal(judgeRunCode({ status: "Failed", run_result: run("TimeLimitExceeded", null) }, "x").result, -3);
  assert.equal(judgeRunCode({ status: "Failed", run_result: run("Finished", 1) }, "x").result, -2);
  assert.equal(judgeRunCode({ status: "SandboxError" }, "x").result, -1);
  assert.equal(judgeRunCode({ status: "Weird" }, "x").status, "unknown_api_status_Weird");
  // non-string inputs and outputs go as Python's str() of them
  assert.equal(pyStr([1, "a'b", true, null, { k: [2.5] }]), `[1, "a'b", True, None, {'k': [2.5]}]`);
  assert.equal(judgeRunCode({ status: "Success", run_result: run("Finished", 0, "[3, 4]\n") }, [3, 4]).result, true);
  assert.equal(judgeRunCode({ status: "Success", run_result: run("Finished", 0, "False") }, false).result, true);
});
