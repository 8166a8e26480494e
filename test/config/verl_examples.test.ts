// verl's own example scripts (examples/**/run_*.sh, captured by scripts/capture-verl-examples.sh into
// fixtures/verl_examples.json) compose here unchanged: every trainer call whose keys all exist in verl's
// config passes `--cfg job` (the same loadConfig, in process).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { packageRoot } from "../../src/utils/paths.js";

interface Entry { script: string; trainer: "ppo" | "sft" | "sft_engine"; configPath: string | null; configName: string | null; overrides: string[] }

const fixture = (name: string) => JSON.parse(readFileSync(join(packageRoot, "test/config/fixtures", name), "utf8"));
const examples = (fixture("verl_examples.json") as { entries: Entry[] }).entries;
const schema = (fixture("verl_schema.json") as { configs: Record<string, Record<string, unknown>> }).configs;
const DEFAULT_CONFIG = { ppo: "ppo_trainer", sft: "sft_trainer", sft_engine: "sft_trainer_engine" } as const;
/** Config groups a command line may choose an option of (engine=megatron, optim=megatron, ...). */
const GROUPS = new Set(["engine", "optim", "model", "profiler", "data", "actor", "critic", "ref", "rollout", "reward_model"]);

/** The root config a call composes, or undefined for configs outside verl's trainer folder (recipes). */
function configOf(e: Entry): string | undefined {
  if (e.configPath !== null && !/^(\.\/)?config\/?$/.test(e.configPath)) return undefined;
  return (e.configName ?? DEFAULT_CONFIG[e.trainer]).replace(/\.ya?ml$/, "");
}

/** Whether every override names a key of verl's own config (`+key` adds one, as Hydra allows). */
function keysInVerl(e: Entry, config: string): boolean {
  const keys = schema[config]!;
  const known = (k: string) => k in keys || Object.keys(keys).some((p) => p.startsWith(`${k}.`));
  return e.overrides.every((o) => {
    const m = /^(~|\+\+|\+)?([^=]+)(?:=(.*))?$/s.exec(o);
    if (!m) return false;
    const [, prefix, key, value] = m;
    // `key=` from a variable the script expects the user's environment to set
    if (value === "" && prefix === undefined) return false;
    if (prefix === "+" || prefix === "++") return true;
    if (!key!.includes(".") && GROUPS.has(key!)) return true;
    return known(key!);
  });
}

const eligible = examples.filter((e) => {
  const config = configOf(e);
  return config !== undefined && keysInVerl(e, config);
});

test("the fixture holds verl's example trainer calls", () => {
  assert.ok(examples.filter((e) => e.trainer === "ppo").length >= 100);
  assert.ok(examples.filter((e) => e.trainer !== "ppo").length >= 9);
  assert.ok(eligible.length >= 90, `only ${eligible.length} calls name keys that all exist in verl's config`);
});

test("every example whose keys all exist in verl's config composes unchanged (--cfg job)", () => {
  const rejected: string[] = [];
  for (const e of eligible) {
    try {
      loadConfig({ configName: configOf(e)!, overrides: e.overrides });
    } catch (err) {
      rejected.push(`${e.script}: ${(err as Error).message.split("\n").slice(0, 3).join(" / ")}`);
    }
  }
  assert.deepEqual(rejected, [], `${rejected.length} of ${eligible.length} rejected`);
});
