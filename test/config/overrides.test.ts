import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigError } from "../../src/config/errors.js";
import { applyOverrides, parseOverride, parseOverrideValue, typeMismatch, type Override } from "../../src/config/overrides.js";
import type { ConfigNode } from "../../src/config/tree.js";

const base = (): ConfigNode => ({
  trainer: { total_epochs: 30, logger: ["console"], resume_from_path: null, device: "auto", val_only: false },
  actor: { optim: { lr: 1e-6, betas: [0.9, 0.999] }, clip_ratio_c: 3.0 },
});

function apply(cfg: ConfigNode, ...raw: string[]): ConfigNode {
  const overrides: Override[] = raw.map((r) => parseOverride(r).override);
  return applyOverrides(cfg, overrides, { defaultOf: (c, k) => k.split(".").reduce<unknown>((n, s) => (n as ConfigNode | undefined)?.[s], c) as never }).config;
}

test("override values parse as YAML scalars, lists and quoted strings", () => {
  assert.equal(parseOverrideValue("3"), 3);
  assert.equal(parseOverrideValue("1e-5"), 1e-5);
  assert.equal(parseOverrideValue("-0.5"), -0.5);
  assert.equal(parseOverrideValue("true"), true);
  assert.equal(parseOverrideValue("False"), false);
  assert.equal(parseOverrideValue("null"), null);
  assert.deepEqual(parseOverrideValue("[a,b]"), ["a", "b"]);
  assert.deepEqual(parseOverrideValue('["console","file"]'), ["console", "file"]);
  assert.deepEqual(parseOverrideValue("{x: 1}"), { x: 1 });
  assert.equal(parseOverrideValue("'123'"), "123");
  assert.equal(parseOverrideValue('"true"'), "true");
  assert.equal(parseOverrideValue("~/data/x.parquet"), "~/data/x.parquet");
  assert.equal(parseOverrideValue(""), "");
  assert.equal(parseOverrideValue("#hash"), "#hash", "a leading # is text, not a YAML comment");
  assert.equal(parseOverrideValue("a: b"), "a: b", "no surprise mappings");
  assert.equal(parseOverrideValue("${a.b}"), "${a.b}");
});

test("override prefixes select set, add, force and delete", () => {
  assert.deepEqual(parseOverride("a.b=1").override, { kind: "set", key: "a.b", value: 1, raw: "a.b=1" });
  assert.equal(parseOverride("+a.b=1").override.kind, "add");
  assert.equal(parseOverride("++a.b=1").override.kind, "force");
  assert.deepEqual(parseOverride("~a.b").override, { kind: "delete", key: "a.b", raw: "~a.b" });
  assert.deepEqual(parseOverride("~a.b=2").override, { kind: "delete", key: "a.b", value: 2, raw: "~a.b=2" });
  assert.equal(parseOverride("data=legacy_data").groupCandidate, true);
  assert.equal(parseOverride("actor_rollout_ref/actor=dp_actor").groupCandidate, true);
  assert.equal(parseOverride("data.x=1").groupCandidate, false);
  assert.equal(parseOverride("a.b=x=y").override.kind === "set" && (parseOverride("a.b=x=y").override as { value: unknown }).value, "x=y");
});

test("malformed overrides are rejected with the override quoted", () => {
  assert.throws(() => parseOverride("a.b"), (e: unknown) => e instanceof ConfigError && /'a\.b' has no '='/.test(e.message) && e.exitCode === 2);
  assert.throws(() => parseOverride("=3"), /has no key/);
  assert.throws(() => parseOverride("a..b=3"), /not a valid dotted key/);
  assert.throws(() => parseOverride("+actor/x=y"), /not supported/);
});

test("an unbalanced quote in a value is refused (exit 2) naming the override; paired quotes and apostrophes pass", () => {
  const refused = (raw: string, why: RegExp) => assert.throws(() => parseOverride(raw), (e: unknown) => {
    assert.ok(e instanceof ConfigError, String(e));
    assert.equal(e.exitCode, 2);
    assert.ok(e.message.startsWith(`override '${raw}': unbalanced quote: `), e.message);
    assert.match(e.message, why);
    return true;
  });
  refused("trainer.experiment_name='my run", /the ' opened in the value is never closed/);
  refused('trainer.experiment_name="my run', /the " opened in the value is never closed/);
  refused("trainer.logger=[console, 'file]", /the ' opened in the value is never closed/);
  refused("trainer.experiment_name=my_run'", /the ' that ends the value was never opened/);
  refused("+data.note=x\"", /the " that ends the value was never opened/);
  refused("~trainer.experiment_name='a", /never closed/);
  assert.equal((parseOverride("trainer.experiment_name='my run'").override as { value: unknown }).value, "my run");
  assert.equal((parseOverride("data.note=don't").override as { value: unknown }).value, "don't");
  assert.equal((parseOverride("data.note='it''s'").override as { value: unknown }).value, "it's");
});

test("set changes an existing key and refuses a missing one, naming the closest keys", () => {
  const cfg = apply(base(), "trainer.total_epochs=2", "actor.optim.lr=1e-5");
  assert.equal((cfg.trainer as ConfigNode).total_epochs, 2);
  assert.equal(((cfg.actor as ConfigNode).optim as ConfigNode).lr, 1e-5);
  assert.throws(() => apply(base(), "actor.optim.lrr=1"), (e: unknown) => e instanceof ConfigError && /'actor\.optim\.lrr'/.test(e.message) && /did you mean actor\.optim\.lr\?/.test(e.message));
  assert.throws(() => apply(base(), "optim.lr=1"), /did you mean actor\.optim\.lr\?/);
  assert.throws(() => apply(base(), "trainer.nope=1"), /trainer has: device, logger/);
});

test("set checks the type against the default", () => {
  assert.throws(() => apply(base(), "actor.optim.lr=abc"), /expected a number like the default 0\.000001, got a string "abc"/);
  assert.throws(() => apply(base(), "trainer.val_only=1"), /expected a boolean/);
  assert.throws(() => apply(base(), "actor.optim=3"), /expected a mapping/);
  assert.throws(() => apply(base(), "trainer.device=[a]"), /expected a string/);
  // int and float are one kind; null defaults take anything; null replaces anything
  assert.equal((apply(base(), "actor.clip_ratio_c=10").actor as ConfigNode).clip_ratio_c, 10);
  assert.deepEqual((apply(base(), "trainer.resume_from_path=[1,2]").trainer as ConfigNode).resume_from_path, [1, 2]);
  assert.equal((apply(base(), "trainer.device=null").trainer as ConfigNode).device, null);
});

test("a list key given one value becomes a one-item list", () => {
  assert.deepEqual((apply(base(), "trainer.logger=file").trainer as ConfigNode).logger, ["file"]);
  assert.deepEqual((apply(base(), "trainer.logger=[console,file]").trainer as ConfigNode).logger, ["console", "file"]);
});

test("+ adds only new keys (creating parents), ++ adds or sets", () => {
  const cfg = apply(base(), "+trainer.extra.deep=5", "++trainer.total_epochs=abc", "++new_top=1");
  assert.deepEqual((cfg.trainer as ConfigNode).extra, { deep: 5 });
  assert.equal((cfg.trainer as ConfigNode).total_epochs, "abc", "++ is the escape hatch: no type check");
  assert.equal(cfg.new_top, 1);
  assert.throws(() => apply(base(), "+trainer.total_epochs=3"), /already exists with value 30.*\+\+trainer\.total_epochs/);
  assert.throws(() => apply(base(), "+trainer.device.x=3"), /parent is not a mapping/);
});

test("~ deletes a key, or only when its value matches", () => {
  assert.equal("device" in (apply(base(), "~trainer.device").trainer as ConfigNode), false);
  assert.equal("device" in (apply(base(), "~trainer.device=auto").trainer as ConfigNode), false);
  assert.throws(() => apply(base(), "~trainer.device=cpu"), /its value is "auto", not "cpu"/);
  assert.throws(() => apply(base(), "~trainer.devise"), /could not delete 'trainer\.devise'.*did you mean trainer\.device/);
});

test("overrides apply in order and never touch the base", () => {
  const b = base();
  const cfg = apply(b, "trainer.total_epochs=2", "trainer.total_epochs=3", "actor.optim.betas=[0.5,0.5]");
  assert.equal((cfg.trainer as ConfigNode).total_epochs, 3);
  assert.deepEqual(b, base());
  assert.equal((cfg.trainer as ConfigNode).logger === (b.trainer as ConfigNode).logger, false);
});

test("target_modules takes a string or a list, as peft does; other string keys keep their type", () => {
  assert.equal(typeMismatch("all-linear", ["q_proj", "v_proj"], "actor_rollout_ref.model.target_modules"), undefined);
  assert.equal(typeMismatch(null, "all-linear", "critic.model.exclude_modules"), undefined);
  assert.match(typeMismatch("prompt", ["a", "b"], "data.prompt_key") ?? "", /expected a string like the default "prompt", got a list/);
});
