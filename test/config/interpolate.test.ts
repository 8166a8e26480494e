import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigError } from "../../src/config/errors.js";
import { resolveAt, resolveConfig } from "../../src/config/interpolate.js";
import type { ConfigNode } from "../../src/config/tree.js";

test("absolute references keep the target's type; embedded ones stringify", () => {
  const cfg = resolveConfig({
    data: { max_prompt_length: 512, files: ["a", "b"], flag: true, none: null },
    rollout: { prompt_length: "${data.max_prompt_length}", files: "${data.files}", flag: "${data.flag}", none: "${data.none}" },
    dir: "ckpt/${data.max_prompt_length}/${data.flag}-${data.none}",
  });
  const r = cfg.rollout as ConfigNode;
  assert.equal(r.prompt_length, 512);
  assert.deepEqual(r.files, ["a", "b"]);
  assert.equal(r.flag, true);
  assert.equal(r.none, null);
  assert.equal(cfg.dir, "ckpt/512/true-null");
  assert.notEqual(r.files, (cfg.data as ConfigNode).files, "interpolated lists are copies");
});

test("relative references: . is a sibling, .. a sibling of the parent", () => {
  const cfg = resolveConfig({
    a: { save: ["m", "o"], load: "${.save}", inner: { up: "${..save}", twice: "${...top}" } },
    top: 7,
    list: [1, "${.0}"],
  });
  const a = cfg.a as ConfigNode;
  assert.deepEqual(a.load, ["m", "o"]);
  assert.deepEqual((a.inner as ConfigNode).up, ["m", "o"]);
  assert.equal((a.inner as ConfigNode).twice, 7);
  assert.deepEqual(cfg.list, [1, 1]);
  assert.throws(() => resolveConfig({ a: "${....x}" }), /climbs above the root/);
});

test("chains of interpolation resolve in any order", () => {
  const cfg = resolveConfig({ c: "${b}", b: "${a}", a: 3, d: "x${c}" });
  assert.deepEqual(cfg, { c: 3, b: 3, a: 3, d: "x3" });
});

test("oc.select falls back to its default only when the path is absent or ???", () => {
  const cfg = resolveConfig({
    data: { max_prompt_length: 100, mandatory: "???" },
    a: "${oc.select:data.max_prompt_length,512}",
    b: "${oc.select:data.nope,512}",
    c: "${oc.select:data.nope}",
    d: "${oc.select:data.mandatory,fallback}",
    e: "${oc.select:data.nope,'quoted, with comma'}",
    f: "${oc.select:data.nope,${data.max_prompt_length}}",
    g: "${oc.select:data.nope,true}",
  });
  assert.equal(cfg.a, 100);
  assert.equal(cfg.b, 512);
  assert.equal(cfg.c, null);
  assert.equal(cfg.d, "fallback");
  assert.equal(cfg.e, "quoted, with comma");
  assert.equal(cfg.f, 100);
  assert.equal(cfg.g, true);
});

test("oc.env reads the environment, with a default, and fails clearly without one", () => {
  process.env.VERL_TEST_ENV_X = "hello";
  delete process.env.VERL_TEST_ENV_UNSET;
  const cfg = resolveConfig({ a: "${oc.env:VERL_TEST_ENV_X}", b: "${oc.env:VERL_TEST_ENV_UNSET,dflt}", c: "${oc.env:VERL_TEST_ENV_UNSET,null}", d: "p/${oc.env:VERL_TEST_ENV_X,z}" });
  assert.deepEqual(cfg, { a: "hello", b: "dflt", c: null, d: "p/hello" });
  assert.throws(() => resolveConfig({ k: { v: "${oc.env:VERL_TEST_ENV_UNSET}" } }), (e: unknown) => e instanceof ConfigError && /k\.v: environment variable VERL_TEST_ENV_UNSET is not set/.test(e.message));
  process.env.VERL_TEST_ENV_NUM = "8";
  assert.equal(resolveConfig({ n: "${oc.decode:${oc.env:VERL_TEST_ENV_NUM}}" }).n, 8);
});

test("cycles and missing targets are errors naming the key", () => {
  assert.throws(() => resolveConfig({ a: "${b}", b: "${c}", c: "${a}" }), (e: unknown) => e instanceof ConfigError && /interpolation cycle: a -> b -> c -> a/.test(e.message));
  assert.throws(() => resolveConfig({ a: { x: "${a}" } }), /interpolation cycle: a -> a\.x -> a/);
  assert.throws(() => resolveConfig({ t: { dir: "ck/${t.projct}", project: "p" } }), (e: unknown) => e instanceof ConfigError && /^t\.dir: interpolation \$\{t\.projct\} points at 't\.projct', which does not exist; did you mean t\.project\?/.test(e.message));
  assert.throws(() => resolveConfig({ a: "???", b: "${a}" }), /b: interpolation \$\{a\} points at 'a', which is mandatory \(\?\?\?\)/);
  assert.throws(() => resolveConfig({ a: "${oc.nope:x}" }), /unknown resolver 'oc\.nope'.*known: oc\.select, oc\.env, oc\.decode/);
  assert.throws(() => resolveConfig({ a: "${b" }), /a: unterminated interpolation/);
});

test("escaped \\${ stays literal; ??? survives when nothing points at it", () => {
  const cfg = resolveConfig({ a: "cost \\${x}", m: "???" });
  assert.equal(cfg.a, "cost ${x}");
  assert.equal(cfg.m, "???");
});

test("nested interpolation inside a path, and through an interpolated mapping", () => {
  const cfg = resolveConfig({ which: "b", a: { b: 5 }, pick: "${a.${which}}", alias: "${a}", deep: "${alias.b}" });
  assert.equal(cfg.pick, 5);
  assert.equal(cfg.deep, 5);
  assert.equal(resolveAt({ a: 1, b: "${a}" }, "b"), 1);
  assert.equal(resolveAt({ a: 1 }, "zz"), undefined);
});
