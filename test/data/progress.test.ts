import { test } from "node:test";
import assert from "node:assert/strict";
import { createProgress } from "../../src/data/progress.js";

test("on a terminal the progress line rewrites itself and ends with a newline", () => {
  let out = "";
  const fake = { isTTY: true, write: (s: string) => { out += s; return true; } } as unknown as NodeJS.WriteStream;
  const p = createProgress("gsm8k train", 4, fake);
  for (let i = 0; i < 4; i++) p.tick();
  p.done();
  assert.match(out, /^\rgsm8k train: 1\/4 \(25%\)/);
  assert.match(out, /\rgsm8k train: 4\/4 \(100%\) done in \d+\.\d\ds\n$/);
});
