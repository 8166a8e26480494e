// `verl plot METRICS.jsonl --out DIR`: one SVG per chart whose metrics are present,
// paths printed; a bad line fails naming the file and line.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { plotMetrics } from "../../src/cli/commands/plot.js";

const MAIN = fileURLToPath(new URL("../../src/cli/main.js", import.meta.url));
let dir = "";

function verl(...args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [MAIN, ...args], { encoding: "utf8", timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : null) : 0, stdout, stderr });
    });
  });
}

/** Well-formed enough: one root svg, every non-self-closing tag closed in order. */
function assertWellFormed(svg: string, file: string): void {
  assert.match(svg, /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/, `${file} starts with an svg root`);
  const stack: string[] = [];
  for (const m of svg.matchAll(/<(\/?)([a-z]+)\b[^>]*?(\/?)>/g)) {
    const [, closing, name, selfClosing] = m;
    if (selfClosing) continue;
    if (closing) assert.equal(stack.pop(), name, `${file}: </${name}> closes the open tag`);
    else stack.push(name!);
  }
  assert.deepEqual(stack, [], `${file}: every tag is closed`);
  assert.equal(svg.includes("NaN"), false, `${file} has no NaN coordinates`);
}

before(() => {
  dir = mkdtempSync(join(tmpdir(), "verl-plot-"));
  const lines = [];
  for (let step = 0; step <= 5; step++) {
    const data: Record<string, unknown> = {};
    if (step === 0 || step === 5) data["val-core/openai/gsm8k/reward/mean@1"] = 0.1 + step * 0.1;
    if (step > 0) {
      Object.assign(data, {
        "critic/score/mean": step / 10, "critic/rewards/mean": step / 10 - 0.01, "actor/kl_loss": 0.001 * step,
        "actor/ppo_kl": 0.0001, "response_length/mean": 10 + step, "response_length/max": 12 + step, "actor/pg_loss": -0.1,
        "timing_s/gen": 1.5, note: "text is skipped",
      });
    }
    lines.push(JSON.stringify({ step, data }));
  }
  writeFileSync(join(dir, "run.jsonl"), lines.join("\n") + "\n");
  writeFileSync(join(dir, "bad.jsonl"), `${lines[0]}\n${lines[1]}\n{"step": 2, "data": \n`);
  writeFileSync(join(dir, "nodata.jsonl"), `{"step": 1, "data": {"timing_s/gen": 1}}\n`);
});
after(() => rmSync(dir, { recursive: true, force: true }));

test("writes one valid SVG per chart with data and draws every point of each series", () => {
  const out = join(dir, "plots");
  const paths = plotMetrics(join(dir, "run.jsonl"), out);
  assert.deepEqual(paths.map((p) => p.slice(out.length + 1)).sort(), ["kl.svg", "loss.svg", "response_length.svg", "reward.svg", "val_accuracy.svg"]);
  for (const p of paths) assertWellFormed(readFileSync(p, "utf8"), p);
  const reward = readFileSync(join(out, "reward.svg"), "utf8");
  const polylines = [...reward.matchAll(/<polyline[^>]*points="([^"]*)"/g)].map((m) => m[1]!.split(" ").length);
  assert.deepEqual(polylines, [5, 5], "two series of five steps");
  assert.match(reward, /critic\/score\/mean/);
  const val = readFileSync(join(out, "val_accuracy.svg"), "utf8");
  assert.match(val, /<polyline[^>]*points="[^" ]+ [^" ]+"/, "val accuracy: the two logged steps");
  assert.match(val, /Validation accuracy: val-core\/openai\/gsm8k\/reward\/mean@1/, "a lone series is named in the title");
});

test("the CLI prints the paths; a bad line exits 1 naming file and line; no plottable metric is an error", async () => {
  const ok = await verl("plot", join(dir, "run.jsonl"), "--out", join(dir, "cli"));
  assert.equal(ok.code, 0, ok.stderr);
  const printed = ok.stdout.trim().split("\n");
  assert.equal(printed.length, 5);
  for (const p of printed) assert.ok(existsSync(p) && p.endsWith(".svg"), p);
  const bad = await verl("plot", join(dir, "bad.jsonl"), "--out", join(dir, "bad"));
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /bad\.jsonl:3: not valid JSON/);
  assert.equal(existsSync(join(dir, "bad")), false, "nothing written when the file is bad");
  const none = await verl("plot", join(dir, "nodata.jsonl"));
  assert.equal(none.code, 1);
  assert.match(none.stderr, /nodata\.jsonl: none of the plotted metrics are present \(numeric keys found: timing_s\/gen\)/);
  const missing = await verl("plot", join(dir, "absent.jsonl"));
  assert.match(missing.stderr, /absent\.jsonl: no such file/);
});
