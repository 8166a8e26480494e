import { test } from "node:test";
import assert from "node:assert/strict";
import { createProgress } from "../../src/data/progress.js";

test("on a terminal the progress line rewrites itself and ends with a newline", () => {
  let out = "";
  const fake = { isTTY: true, write: (s: string) => { out += s; return true; } } as unknown as NodeJS.WriteStream;
  const p = createProgress("gsm8k train", 4, fake);
  assert.equal(out, "\rgsm8k train: 0/4 (0%)\x1b[K", "the line shows before the first item is done");
  for (let i = 0; i < 4; i++) p.tick();
  p.done();
  assert.match(out, /\rgsm8k train: 1\/4 \(25%\)\x1b\[K/);
  assert.match(out, /\rgsm8k train: 4\/4 \(100%\)\x1b\[K done in \d+\.\d\ds\n$/);
});

test("status() shows work inside an item on a terminal only", () => {
  let out = "";
  const fake = { isTTY: true, write: (s: string) => { out += s; return true; } } as unknown as NodeJS.WriteStream;
  createProgress("generate", 2, fake).status("rows 1-2: token 1/48");
  assert.equal(out, "\rgenerate: 0/2 (0%)\x1b[K\rgenerate: 0/2 (0%) rows 1-2: token 1/48\x1b[K");
  let piped = "";
  const pipe = { isTTY: false, write: (s: string) => { piped += s; return true; } } as unknown as NodeJS.WriteStream;
  createProgress("generate", 2, pipe).status("token 1/48");
  assert.equal(piped, "");
});
