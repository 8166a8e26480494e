// reward_model.sandbox_fusion.{url,max_concurrent,memory_limit_mb}: verl's code-execution reward. With
// a url set and no custom_reward_function, the data sources verl routes to the sandbox (codecontests,
// apps, codeforces, taco) are scored by running the response's code against the row's test cases on a
// Sandbox Fusion service (its run_code API); every other data source keeps its built-in scorer.
//
// As verl scores it: the code is the last ```python block (else the first ``` block, minus a language
// line); ground_truth is {inputs, outputs[, fn_name][, assert_case]} (a dict or its JSON); each case is
// one run_code request (stdin = the input; with fn_name the code is wrapped to call that function on
// the input's JSON lines; an assert_case is appended to the code). A case passes when the run succeeds
// and stdout equals the expected output up to trailing newlines (or no output is expected). The score
// is the pass rate over the first 10 cases (verl's continuous=True). Cases run concurrently, at most
// max_concurrent requests in flight over the whole manager; a request gets compile + run timeout +
// 10 s, and a 504 is retried twice (1 s, then 2 s later). Service failures score a case as failed
// (verl's -1), never stop the run.
import { getPath, type Config } from "../config/index.js";
import { Semaphore } from "../agent_loop/semaphore.js";
import { logger } from "../utils/logger.js";
import { defaultComputeScore } from "./scorers/registry.js";
import type { BatchComputeScoreFn, ComputeScoreFn } from "./types.js";

export const SANDBOX_DATA_SOURCES: readonly string[] = ["codecontests", "apps", "codeforces", "taco"];
/** verl's compute timeout per case (compile and run each), and the slack on the HTTP request. */
export const SANDBOX_CASE_TIMEOUT_S = 10;
const API_SLACK_S = 10;
const MAX_ATTEMPTS = 3;
const RETRY_DELAY_MS = 1000;
/** verl scores the pass rate over the first cases only (continuous=True). */
const CONTINUOUS_CASES = 10;

export interface SandboxSettings {
  url: string;
  maxConcurrent: number;
  memoryLimitMb: number;
}

/** reward_model.sandbox_fusion, or null when its url is unset. Bad values name their key. */
export function sandboxSettings(config: Config): SandboxSettings | null {
  const url = getPath(config, "reward_model.sandbox_fusion.url");
  if (url === undefined || url === null || url === "") return null;
  if (typeof url !== "string") throw new Error(`reward_model.sandbox_fusion.url must be a string, got ${JSON.stringify(url)}`);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`reward_model.sandbox_fusion.url=${url} is not a URL (verl's form: http(s)://<host>/run_code)`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new Error(`reward_model.sandbox_fusion.url=${url}: only http and https are supported`);
  const positiveInt = (k: string, dflt: number): number => {
    const v = getPath(config, `reward_model.sandbox_fusion.${k}`) ?? dflt;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw new Error(`reward_model.sandbox_fusion.${k} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  return { url, maxConcurrent: positiveInt("max_concurrent", 64), memoryLimitMb: positiveInt("memory_limit_mb", 1024) };
}

export interface RunCodeRequest {
  compile_timeout: number;
  run_timeout: number;
  code: string;
  stdin: string | null;
  memory_limit_MB: number;
  language: string;
  files: Record<string, string>;
  fetch_files: string[];
}

/** One run_code call with verl's retry rule: a 504 is retried, any other failure is final. */
export async function callRunCode(url: string, request: RunCodeRequest): Promise<{ response: Record<string, unknown> | null; error: string | null }> {
  const timeoutMs = (request.compile_timeout + request.run_timeout + API_SLACK_S) * 1000;
  let lastError = "";
  for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
    let res: Response;
    try {
      res = await fetch(url, {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify(request),
        signal: AbortSignal.timeout(timeoutMs),
      });
    } catch (e) {
      const err = e as Error;
      const why = err.name === "TimeoutError" ? `no answer within ${timeoutMs / 1000} s` : `${err.message}${err.cause ? ` (${(err.cause as Error).message ?? String(err.cause)})` : ""}`;
      return { response: null, error: `sandbox request to ${url} failed: ${why}` };
    }
    if (res.status === 504) {
      await res.body?.cancel();
      lastError = `sandbox ${url} answered 504 Gateway Timeout on attempt ${attempt}/${MAX_ATTEMPTS}`;
      if (attempt < MAX_ATTEMPTS) await new Promise((r) => setTimeout(r, RETRY_DELAY_MS * attempt));
      continue;
    }
    const text = await res.text();
    if (!res.ok) return { response: null, error: `sandbox ${url} answered HTTP ${res.status}: ${text.slice(0, 200)}` };
    try {
      const json = JSON.parse(text) as unknown;
      if (typeof json !== "object" || json === null || Array.isArray(json)) return { response: null, error: `sandbox ${url} answered ${text.slice(0, 200)}, not a JSON object` };
      return { response: json as Record<string, unknown>, error: null };
    } catch (e) {
      return { response: null, error: `sandbox ${url} answered a body that is not JSON (${(e as Error).message}): ${text.slice(0, 200)}` };
    }
  }
  return { response: null, error: lastError };
}

/** A case's outcome in verl's codes: true pass, false wrong answer, -1 service error, -2 runtime error, -3 timeout, -4 compile error. */
export type CaseResult = boolean | -1 | -2 | -3 | -4;

export interface CaseMeta {
  case_index: number;
  status: string;
  stdout?: string | null;
  stderr?: string | null;
  exit_code?: number | null;
  api_request_error?: string | null;
  [k: string]: unknown;
}

/** Python's str() of a test-case value (verl sends str(input) and compares with str(expected)): strings as they are. */
export function pyStr(v: unknown): string {
  return typeof v === "string" ? v : pyRepr(v);
}

/** Python's repr() of a JSON value: True/False/None, single-quoted strings, ", " and ": " separators. */
function pyRepr(v: unknown): string {
  if (v === null || v === undefined) return "None";
  if (typeof v === "boolean") return v ? "True" : "False";
  if (typeof v === "number") return Number.isFinite(v) ? String(v) : Number.isNaN(v) ? "nan" : v > 0 ? "inf" : "-inf";
  if (typeof v === "string") {
    const body = v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
    // Python quotes with ' unless the string holds ' and no "
    return v.includes("'") && !v.includes('"') ? `"${body}"` : `'${body.replace(/'/g, "\\'")}'`;
  }
  if (Array.isArray(v)) return `[${v.map(pyRepr).join(", ")}]`;
  if (typeof v === "object") return `{${Object.entries(v as Record<string, unknown>).map(([k, x]) => `${pyRepr(k)}: ${pyRepr(x)}`).join(", ")}}`;
  return String(v);
}

/**
 * With fn_name the code defines a function (or a Solution method) rather than reading stdin: run it on
 * the arguments given one JSON value per stdin line, and print the result (JSON for containers, None
 * and booleans; str() otherwise). The standard modules verl's wrapper provides are imported and
 * star-imported first, since solutions written for it use them unimported.
 */
export function functionCallWrapper(code: string, fnName: string): string {
  const modules = ["string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing"];
  return `import importlib as _imp
for _name in ${JSON.stringify(modules)}:
    _mod = _imp.import_module(_name)
    _public = getattr(_mod, "__all__", None) or [k for k in vars(_mod) if not k.startswith("_")]
    globals().update({k: getattr(_mod, k) for k in _public if hasattr(_mod, k)})
for _name in ${JSON.stringify(modules.filter((m) => m !== "builtins" && m !== "typing"))}:
    globals()[_name] = _imp.import_module(_name)
import sys, json, traceback

${code}

def _verl_ts_call(_fn_name):
    _text = sys.stdin.read()
    try:
        _args = [json.loads(_line) for _line in _text.split("\\n")] if _text.strip() else []
    except json.JSONDecodeError as _e:
        sys.stderr.write("wrapper: the input is not one JSON value per line: %s\\n" % _e)
        return None, True
    try:
        if _fn_name in globals():
            _target = globals()[_fn_name]
        elif "Solution" in globals():
            _target = getattr(globals()["Solution"](), _fn_name)
        else:
            sys.stderr.write("wrapper: no function or Solution method named %s\\n" % _fn_name)
            return None, True
        return _target(*_args), False
    except Exception:
        sys.stderr.write(traceback.format_exc())
        return None, True

if __name__ == "__main__":
    _out, _failed = _verl_ts_call(${JSON.stringify(fnName)})
    if not _failed:
        print(json.dumps(_out) if _out is None or isinstance(_out, (dict, list, tuple, bool)) else str(_out))
`;
}

/** verl's status rules for one run_code answer. */
export function judgeRunCode(api: Record<string, unknown>, expected: unknown): { result: CaseResult; status: string; meta: Partial<CaseMeta> } {
  const compile = (api.compile_result ?? null) as Record<string, unknown> | null;
  const run = (api.run_result ?? null) as Record<string, unknown> | null;
  const meta: Partial<CaseMeta> = {
    api_status: api.status ?? null,
    compile_status: compile?.status ?? null, compile_stderr: compile?.stderr ?? null,
    run_status: run?.status ?? null, stdout: (run?.stdout ?? null) as string | null, stderr: (run?.stderr ?? null) as string | null,
    exit_code: (run?.return_code ?? null) as number | null, duration: run?.execution_time ?? null,
  };
  switch (api.status) {
    case "SandboxError":
      return { result: -1, status: "sandbox_error", meta };
    case "Failed": {
      const cs = compile?.status;
      if (compile && (cs === "Error" || cs === "TimeLimitExceeded" || (cs === "Finished" && compile.return_code !== 0))) {
        return { result: -4, status: cs === "TimeLimitExceeded" ? "compile_timeout" : "compile_error", meta };
      }
      if (!run) return { result: -1, status: "unknown_failure_state", meta };
      if (run.status === "TimeLimitExceeded") return { result: -3, status: "timeout", meta };
      if (run.status === "Error" || (run.status === "Finished" && run.return_code !== 0)) return { result: -2, status: "runtime_error", meta };
      return { result: -1, status: "unknown_failure", meta };
    }
    case "Success": {
      if (!run || run.status !== "Finished") return { result: -1, status: "unexpected_success_state", meta };
      const actual = typeof run.stdout === "string" ? run.stdout : "";
      const pass = expected === null || expected === undefined || actual.replace(/\n+$/, "") === pyStr(expected).replace(/\n+$/, "");
      return { result: pass, status: pass ? "success" : "wrong_answer", meta };
    }
    default:
      return { result: -1, status: `unknown_api_status_${String(api.status)}`, meta };
  }
}

export interface TestCases {
  inputs: unknown[];
  outputs: unknown[];
  fn_name?: string;
  assert_case?: string[];
}

/** Every case of one solution against the sandbox (verl's check_correctness). */
export async function checkCorrectness(
  s: SandboxSettings, sem: Semaphore, cases: TestCases, code: string, timeoutS = SANDBOX_CASE_TIMEOUT_S,
): Promise<{ results: CaseResult[]; meta: CaseMeta[] }> {
  const { inputs, outputs } = cases;
  const n = inputs.length;
  if (n === 0) return { results: [], meta: [] };
  const asserts = cases.assert_case ?? new Array<string>(n).fill("");
  if (outputs.length !== n || asserts.length !== n) {
    return { results: new Array<CaseResult>(n).fill(-1), meta: inputs.map((_, i) => ({ case_index: i, status: "error", api_request_error: "input/output count mismatch" })) };
  }
  const settled = await Promise.all(inputs.map(async (input, i): Promise<[CaseResult, CaseMeta]> => {
    const program = `${code}\n\n${asserts[i] ?? ""}`;
    const request: RunCodeRequest = {
      compile_timeout: timeoutS, run_timeout: timeoutS,
      code: cases.fn_name ? functionCallWrapper(program, cases.fn_name) : program,
      stdin: input === null || input === undefined ? null : pyStr(input),
      memory_limit_MB: s.memoryLimitMb, language: "python", files: {}, fetch_files: [],
    };
    const { response, error } = await sem.run(() => callRunCode(s.url, request));
    if (error !== null || response === null) {
      logger().warn({ case_index: i, error }, "sandbox fusion: a test case could not be run (scored as failed)");
      return [-1, { case_index: i, status: "api_error", api_request_error: error }];
    }
    const judged = judgeRunCode(response, outputs[i]);
    return [judged.result, { case_index: i, ...judged.meta, status: judged.status }];
  }));
  const results = settled.map(([r]) => r), meta = settled.map(([, m]) => m);
  // verl: once a case fails to compile, every later case counts as a compile error too
  const firstCompileError = results.indexOf(-4);
  if (firstCompileError >= 0) {
    for (let i = firstCompileError + 1; i < n; i++) {
      if (results[i] !== -4) {
        results[i] = -4;
        meta[i]!.status = "compile_error_skipped";
      }
    }
  }
  return { results, meta };
}

/** The code to run: verl's extraction from a completion (null when there is no code block). */
export function extractCode(completion: string): string | null {
  if (completion.includes("```python")) return completion.split("```python").at(-1)!.split("```")[0]!;
  if (!completion.includes("```")) return null;
  let solution = completion.split("```")[1]!;
  const nl = solution.indexOf("\n");
  // a language name on the fence's line ("```cpp") is dropped
  if (nl >= 0 && /^[\p{L}]+$/u.test(solution.slice(0, nl).trim())) solution = solution.slice(nl + 1);
  return solution;
}

/** A row's ground truth as test cases, or why it cannot be (verl then scores 0). */
export function parseTestCases(groundTruth: unknown): TestCases | string {
  let tc = groundTruth;
  if (typeof tc === "string") {
    try {
      tc = JSON.parse(tc) as unknown;
    } catch {
      return "ground truth is not valid JSON test cases";
    }
  }
  if (typeof tc !== "object" || tc === null || Array.isArray(tc)) return "ground truth is not a {inputs, outputs} mapping";
  const o = { ...(tc as Record<string, unknown>) };
  if (Array.isArray(o.assert_case)) {
    o.inputs ??= o.assert_case.map(() => "");
    o.outputs ??= o.assert_case.map(() => null);
  }
  if (!Array.isArray(o.inputs) || !Array.isArray(o.outputs)) return "ground truth has no inputs/outputs lists";
  return {
    inputs: o.inputs, outputs: o.outputs,
    ...(typeof o.fn_name === "string" && o.fn_name !== "" ? { fn_name: o.fn_name } : {}),
    ...(Array.isArray(o.assert_case) ? { assert_case: o.assert_case.map((a) => (typeof a === "string" ? a : String(a))) } : {}),
  };
}

/** verl's sandbox_fusion.compute_score with continuous=True: the pass rate over the first 10 cases. */
export async function sandboxComputeScore(s: SandboxSettings, sem: Semaphore, completion: string, groundTruth: unknown): Promise<{ score: number; meta: CaseMeta[] | string }> {
  const code = extractCode(completion);
  if (code === null) return { score: 0, meta: "no code block in the response" };
  const cases = parseTestCases(groundTruth);
  if (typeof cases === "string") return { score: 0, meta: cases };
  const { results, meta } = await checkCorrectness(s, sem, cases, code);
  const considered = results.slice(0, CONTINUOUS_CASES);
  if (considered.length === 0) return { score: 0, meta };
  return { score: considered.filter((r) => r === true).length / considered.length, meta };
}

/**
 * verl's default_compute_score with sandbox_fusion_url bound: the code data sources go to the sandbox
 * (their score is the pass rate, a plain number, as verl returns it), the rest to the built-in scorers.
 */
export function sandboxDefaultComputeScore(s: SandboxSettings): { computeScore: ComputeScoreFn; computeBatch: BatchComputeScoreFn } {
  const sem = new Semaphore(s.maxConcurrent);
  const computeScore: ComputeScoreFn = async (ds, sol, gt, extra) =>
    SANDBOX_DATA_SOURCES.includes(ds) ? (await sandboxComputeScore(s, sem, sol, gt)).score : defaultComputeScore(ds, sol, gt, extra);
  const computeBatch: BatchComputeScoreFn = (dss, sols, gts, extras) => Promise.all(dss.map((ds, i) => computeScore(ds, sols[i]!, gts[i], extras[i])));
  return { computeScore, computeBatch };
}
