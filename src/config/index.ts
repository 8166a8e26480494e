// Layered configuration as verl uses Hydra/OmegaConf: compose YAML files through
// defaults lists, apply command-line overrides, resolve interpolations, validate.
import { stringify } from "yaml";
import { composeConfig, type GroupChoice } from "./compose.js";
import { ConfigError } from "./errors.js";
import { resolveConfig, resolveAt } from "./interpolate.js";
import { applyOverrides, parseOverride, typeMismatch, type Override } from "./overrides.js";
import { ruleFor } from "./key_kinds.js";
import { getPath, type Config, type ConfigNode } from "./tree.js";

export { ConfigError } from "./errors.js";
export { composeConfig, packageConfDir } from "./compose.js";
export { resolveConfig, resolveAt } from "./interpolate.js";
export { applyOverrides, parseOverride, parseOverrideValue, type Override } from "./overrides.js";
export { suggestKeys, editDistance } from "./suggest.js";
export { KEY_RULES, ROLLOUT_NAMES, STRATEGIES, ruleFor, type KeyKind, type KeyRule } from "./key_kinds.js";
export { checkKeyKinds, keyReportWarning, leafEntries, type KeyReport } from "./key_check.js";
export { validatePpoConfig, validateDevice, LOSS_AGG_MODES, type PpoBatchPlan } from "./validate.js";
export { getPath, hasPath, listPaths, type Config, type ConfigNode, type ConfigValue } from "./tree.js";

export interface LoadConfigOptions {
  /** Root config: ppo_trainer, sft_trainer, generation, evaluation, or a recipe's name / YAML path. */
  configName: string;
  /** A folder searched before the package's conf/ (Hydra's --config-path), relative to cwd. */
  configPath?: string;
  /** Hydra-style overrides: a.b=v, +a.b=v, ++a.b=v, ~a.b[=v], group=option. */
  overrides?: readonly string[];
  cwd?: string;
}

/** A loaded config with what it came from: the composed defaults and the overridden tree, both unresolved. */
export interface LoadedConfig {
  config: Config;
  defaults: ConfigNode;
  raw: ConfigNode;
}

/** Compose, override and resolve a config. Throws ConfigError (exit code 2) on any bad input. */
export function loadConfig(opts: LoadConfigOptions): Config {
  return loadConfigDetailed(opts).config;
}

/** `+key=v` over an existing key: Hydra allows it on null; verl-ts's own keys must not block verl's `+key` either. */
function addableOver(key: string, current: unknown): boolean {
  return current === null || ruleFor(key)?.own === true;
}

/** loadConfig, keeping the composed defaults and the unresolved overridden tree (for checkKeyKinds). */
export function loadConfigDetailed(opts: LoadConfigOptions): LoadedConfig {
  const parsed = (opts.overrides ?? []).map(parseOverride);
  const choices: (GroupChoice & { index: number })[] = [];
  parsed.forEach((p, index) => {
    if (p.groupCandidate && p.override.kind === "set" && typeof p.override.value === "string") {
      choices.push({ key: p.override.key, option: p.override.value, raw: p.override.raw, used: false, index });
    }
  });
  const base = composeConfig({ configName: opts.configName, configPath: opts.configPath, groupChoices: choices, cwd: opts.cwd });
  const claimed = new Set<number>();
  for (const c of choices) {
    if (c.used) claimed.add(c.index);
    else if (/[/@]/.test(c.key)) {
      throw new ConfigError(`could not override config group '${c.key}' (${c.raw}): no such group in the defaults list of '${opts.configName}'`);
    }
  }
  const valueOverrides: Override[] = parsed.filter((_, i) => !claimed.has(i)).map((p) => p.override);
  const { config, deferred } = applyOverrides(base, valueOverrides, { defaultOf: tryResolveAt, addableOver });
  const resolved = resolveConfig(config);
  for (const d of deferred) {
    const bad = typeMismatch(d.expected, getPath(resolved, d.key) ?? null, d.key);
    if (bad) throw new ConfigError(`could not override '${d.key}' (${d.raw}): ${bad}`);
  }
  return { config: resolved, defaults: base, raw: config };
}

/** The default a key has in the tree as it stands, interpolations resolved; undefined if that fails. */
function tryResolveAt(cfg: ConfigNode, key: string) {
  try {
    return resolveAt(cfg, key);
  } catch {
    return undefined;
  }
}

/** YAML with sorted keys and no anchors/aliases (what `--cfg job` prints). */
export function toYaml(cfg: Config): string {
  return stringify(cfg, { sortMapEntries: true, aliasDuplicateObjects: false, lineWidth: 0 });
}

/** The names of the root configs shipped in conf/. */
export const CONFIG_NAMES = ["ppo_trainer", "ppo_megatron_trainer", "sft_trainer", "sft_trainer_engine", "generation", "evaluation"] as const;
