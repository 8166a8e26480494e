// envSwitch (src/utils/env_switch.ts): a 0/1 switch from the environment, its default when unset,
// and an error naming the variable for anything else.
import { test } from "node:test";
import assert from "node:assert/strict";
import { envSwitch } from "../../src/utils/env_switch.js";

test("envSwitch: unset or empty gives the default; 0 and 1 are off and on; anything else names the variable", () => {
  for (const fallback of [true, false]) {
    assert.equal(envSwitch("VERL_X", fallback, undefined), fallback);
    assert.equal(envSwitch("VERL_X", fallback, ""), fallback);
    assert.equal(envSwitch("VERL_X", fallback, "1"), true);
    assert.equal(envSwitch("VERL_X", fallback, "0"), false);
  }
  assert.throws(() => envSwitch("VERL_X", true, "yes"), /VERL_X must be 0 or 1, got 'yes'/);
  process.env.VERL_ENV_SWITCH_TEST = "0";
  try { assert.equal(envSwitch("VERL_ENV_SWITCH_TEST", true), false, "read from the environment by default"); } finally { delete process.env.VERL_ENV_SWITCH_TEST; }
});
