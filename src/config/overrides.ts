// Hydra's command-line override grammar:
//   a.b=v     set an existing key (v parsed as YAML: numbers, booleans, null, [lists], {maps}, 'quoted')
//   +a.b=v    add a key that does not exist yet
//   ++a.b=v   add or set, whatever is there
//   ~a.b      delete a key;  ~a.b=v deletes it only if its value equals v
//   group=option / group@pkg=option / pkg/path=option   choose a config-group file (handled in compose.ts)
import { parse } from "yaml";
import { ConfigError } from "./errors.js";
import { unknownKeyHint } from "./suggest.js";
import { deepCopy, deepEqual, deletePath, getPath, isNode, setPath, splitPath, type ConfigNode, type ConfigValue } from "./tree.js";

export type Override =
  | { kind: "set" | "add" | "force"; key: string; value: ConfigValue; raw: string }
  | { kind: "delete"; key: string; value?: ConfigValue; raw: string };

const KEY_RE = /^[A-Za-z_][\w\-]*(?:(?:\.[\w\-]+)|(?:\[\d+\]))*$/;
const GROUP_KEY_RE = /^\/?[\w\-.]+(?:\/[\w\-.]+)*(?:@[\w\-.]+)?$/;
const NULL_WORDS = new Set(["null", "Null", "NULL", "~"]);

/** Parse the text after '=' the way Hydra does for plain values: YAML, but never a surprise mapping or comment. */
export function parseOverrideValue(text: string): ConfigValue {
  const t = text.trim();
  if (t === "") return "";
  let v: unknown;
  try {
    v = parse(t);
  } catch {
    return t;
  }
  if (v === null && !NULL_WORDS.has(t)) return t; // "#foo" is a comment to YAML, a string to a user
  if (isNode(v) && !t.startsWith("{")) return t; // "a: b" is a string here, not a mapping
  if (v === undefined) return t;
  return v as ConfigValue;
}

/**
 * Hydra refuses a value whose quotes do not pair up; kept as a literal, a quote the shell half-ate
 * would end up inside a path or a name. Apostrophes inside a word (don't) stay literal.
 */
function checkQuotes(raw: string, valueText: string): void {
  const t = valueText.trim();
  let why = "";
  try {
    parse(t);
  } catch (e) {
    const m = /Missing closing (['"])quote/.exec((e as Error).message);
    if (m) why = `the ${m[1]} opened in the value is never closed`;
  }
  const last = t.at(-1);
  if (!why && (last === "'" || last === '"') && t.indexOf(last) === t.length - 1) {
    why = `the ${last} that ends the value was never opened`;
  }
  if (why) {
    throw new ConfigError(`override '${raw}': unbalanced quote: ${why}; pair the quotes, or drop them (for the shell, wrap the whole override: "key='a b'")`);
  }
}

export interface ParsedOverride {
  override: Override;
  /** True when the key has the shape of a config group (no dots, or a '/' or '@'): compose.ts may claim it. */
  groupCandidate: boolean;
}

/**
 * How deep a key (segments) plus its value (nested lists and mappings) may go. verl's deepest keys
 * have 7 segments; the tree code recurses, and 5000 segments overflowed the stack.
 */
export const MAX_CONFIG_DEPTH = 64;

/** Nesting depth of a parsed value (a scalar is 0), without recursion. */
function valueDepth(v: ConfigValue): number {
  let max = 0;
  const stack: [unknown, number][] = [[v, 0]];
  while (stack.length > 0) {
    const [x, d] = stack.pop()!;
    if (d > max) max = d;
    if (d > MAX_CONFIG_DEPTH) break;
    if (x !== null && typeof x === "object") for (const c of Object.values(x as object)) stack.push([c, d + 1]);
  }
  return max;
}

function checkDepth(raw: string, key: string, valueLevels = 0): void {
  const segments = key.replace(/\[(\d+)\]/g, ".$1").split(".").length;
  const depth = segments + valueLevels;
  if (depth > MAX_CONFIG_DEPTH) {
    throw new ConfigError(`override '${raw.length > 80 ? `${raw.slice(0, 80)}...` : raw}' nests ${depth} levels deep (${segments} key segments); config keys and values are limited to ${MAX_CONFIG_DEPTH} levels`);
  }
}

export function parseOverride(raw: string): ParsedOverride {
  const m = /^(~|\+\+|\+)?([^=]*)(?:=([\s\S]*))?$/.exec(raw);
  const prefix = m?.[1] ?? "";
  const key = (m?.[2] ?? "").trim();
  const valueText = m?.[3];
  if (!m || key === "") throw new ConfigError(`override '${raw}' has no key: write key=value, +key=value, ++key=value or ~key`);
  const isGroupShaped = /[/@]/.test(key);
  if (isGroupShaped) {
    if (prefix !== "") throw new ConfigError(`override '${raw}': '${prefix}' on a config group is not supported; write ${key}=OPTION to pick a group option`);
    if (!GROUP_KEY_RE.test(key) || valueText === undefined) throw new ConfigError(`override '${raw}' is not a valid group choice: write group=option (e.g. actor_rollout_ref/actor=dp_actor)`);
    return { override: { kind: "set", key, value: valueText.trim(), raw }, groupCandidate: true };
  }
  if (!KEY_RE.test(key)) throw new ConfigError(`override '${raw}': '${key}' is not a valid dotted key`);
  checkDepth(raw, key);
  if (valueText !== undefined) checkQuotes(raw, valueText);
  if (prefix === "~") {
    const override: Override = valueText === undefined ? { kind: "delete", key, raw } : { kind: "delete", key, value: parseOverrideValue(valueText), raw };
    return { override, groupCandidate: false };
  }
  if (valueText === undefined) throw new ConfigError(`override '${raw}' has no '=': write ${prefix}${key}=VALUE (or ~${key} to delete it)`);
  const kind = prefix === "++" ? "force" : prefix === "+" ? "add" : "set";
  // the YAML parser itself runs out of memory on thousands of nested brackets: count them first
  let open = 0, deepest = 0;
  for (const ch of valueText) {
    if (ch === "[" || ch === "{") deepest = Math.max(deepest, ++open);
    else if (ch === "]" || ch === "}") open--;
  }
  if (deepest > MAX_CONFIG_DEPTH) checkDepth(raw, key, deepest);
  const value = parseOverrideValue(valueText);
  checkDepth(raw, key, valueDepth(value));
  return { override: { kind, key, value, raw }, groupCandidate: kind === "set" && !key.includes(".") && !key.includes("[") };
}

type Kind = "null" | "boolean" | "number" | "string" | "list" | "mapping";

function kindOf(v: ConfigValue): Kind {
  if (v === null) return "null";
  if (Array.isArray(v)) return "list";
  if (isNode(v)) return "mapping";
  return typeof v as "boolean" | "number" | "string";
}

export function hasInterpolation(v: ConfigValue | undefined): boolean {
  return typeof v === "string" && /(^|[^\\])\$\{/.test(v);
}

/** A key whose final value must match a type once interpolations are resolved. */
export interface DeferredTypeCheck { key: string; raw: string; expected: ConfigValue }

/** Keys verl types as "a string or a list of strings" (peft's target_modules: "all-linear" or [q_proj, v_proj]). */
const STRING_OR_LIST = new Set(["target_modules", "exclude_modules"]);
/** Step frequencies that verl's engine SFT trainer also takes as "after_each_epoch". */
const STEPS_OR_EPOCH = new Set(["test_freq", "save_freq"]);

/** Null defaults and '???' take anything; null may replace anything; int and float are one kind. */
export function typeMismatch(expected: ConfigValue, value: ConfigValue, key?: string): string | undefined {
  if (expected === null || expected === "???" || value === null) return undefined;
  const want = kindOf(expected), got = kindOf(value);
  if (want === got) return undefined;
  const leaf = key?.slice(key.lastIndexOf(".") + 1);
  if (leaf && STRING_OR_LIST.has(leaf) && (want === "string" || want === "list") && (got === "string" || got === "list")) return undefined;
  if (leaf && STEPS_OR_EPOCH.has(leaf) && want === "number" && value === "after_each_epoch") return undefined;
  const shown = (v: ConfigValue) => JSON.stringify(v);
  return `expected a ${want} like the default ${shown(expected)}, got a ${got} ${shown(value)}`;
}

export interface ApplyOptions {
  /** The type a key's default has, resolving interpolations in the tree as it stands (undefined: unknown). */
  defaultOf(cfg: ConfigNode, key: string): ConfigValue | undefined;
  /** Whether `+key=...` may set a key that exists (Hydra allows it where the value is null). */
  addableOver?(key: string, current: ConfigValue): boolean;
}

/** Hydra's `+` on an existing key: allowed where its value is null. */
const nullAddable = (_key: string, current: ConfigValue) => current === null;

/**
 * Apply overrides in order to a copy of `base`. Type checks of interpolated values come back deferred.
 * Every override naming a key that is not there is gathered into one ConfigError.
 */
export function applyOverrides(base: ConfigNode, overrides: readonly Override[], opts: ApplyOptions): { config: ConfigNode; deferred: DeferredTypeCheck[] } {
  const cfg = deepCopy(base);
  const deferred: DeferredTypeCheck[] = [];
  const unknown: string[] = [];
  const addableOver = opts.addableOver ?? nullAddable;
  for (const o of overrides) {
    const segs = splitPath(o.key);
    const current = getPath(cfg, segs);
    switch (o.kind) {
      case "set": {
        if (current === undefined) {
          unknown.push(`could not override '${o.key}' (${o.raw}): the key is not in the config; ${unknownKeyHint(cfg, o.key)} (use +${o.key}=... to add a new key)`);
          break;
        }
        const expected = opts.defaultOf(cfg, o.key);
        let value = deepCopy(o.value);
        // A list key given one value means a one-item list (trainer.logger=console), as verl's scripts write it.
        if (Array.isArray(expected) && value !== null && !Array.isArray(value) && !isNode(value) && !hasInterpolation(value)) value = [value];
        if (expected !== undefined) {
          if (hasInterpolation(value)) deferred.push({ key: o.key, raw: o.raw, expected });
          else {
            const bad = typeMismatch(expected, value, o.key);
            if (bad) throw new ConfigError(`could not override '${o.key}' (${o.raw}): ${bad}`);
          }
        }
        setPath(cfg, segs, value, false);
        break;
      }
      case "add": {
        if (current !== undefined && !addableOver(o.key, current)) {
          throw new ConfigError(`could not add '${o.key}' (${o.raw}): the key already exists with value ${JSON.stringify(current)}; use ${o.key}=... to change it or ++${o.key}=... to force`);
        }
        if (!setPath(cfg, segs, deepCopy(o.value), true)) throw new ConfigError(`could not add '${o.key}' (${o.raw}): its parent is not a mapping`);
        break;
      }
      case "force": {
        if (!setPath(cfg, segs, deepCopy(o.value), true)) throw new ConfigError(`could not set '${o.key}' (${o.raw}): its parent is not a mapping`);
        break;
      }
      case "delete": {
        if (current === undefined) {
          unknown.push(`could not delete '${o.key}' (${o.raw}): the key is not in the config; ${unknownKeyHint(cfg, o.key)}`);
          break;
        }
        if (o.value !== undefined && !deepEqual(current, o.value)) {
          throw new ConfigError(`could not delete '${o.key}' (${o.raw}): its value is ${JSON.stringify(current)}, not ${JSON.stringify(o.value)}`);
        }
        deletePath(cfg, segs);
        break;
      }
    }
  }
  if (unknown.length > 0) {
    if (unknown.length === 1) throw new ConfigError(unknown[0]!);
    throw new ConfigError(`${unknown.length} overrides name keys that are not in the config:\n  - ${unknown.join("\n  - ")}`);
  }
  return { config: cfg, deferred };
}
