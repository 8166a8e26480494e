// Holds a composed config to the key kinds of key_kinds.ts before a run starts: a verl feature not
// built here is an error naming it; inert keys set away from their default, and keys added with `+`
// that nothing declares, are gathered for one warning. Nothing is accepted and silently ignored.
import { ConfigError } from "./errors.js";
import { ruleFor, type KeyRule } from "./key_kinds.js";
import { deepEqual, getPath, isNode, type ConfigNode, type ConfigValue } from "./tree.js";

export interface KeyReport {
  /** Inert keys whose value differs from the composed default. */
  inert: { key: string; value: ConfigValue; what: string }[];
  /** Keys that are not in the composed defaults and that no rule declares (added with `+`). */
  unread: string[];
}

/** Leaf keys (empty mappings count as leaves) with their values. */
export function leafEntries(node: ConfigNode, prefix = ""): [string, ConfigValue][] {
  const out: [string, ConfigValue][] = [];
  for (const [k, v] of Object.entries(node)) {
    const p = prefix ? `${prefix}.${k}` : k;
    if (isNode(v) && Object.keys(v).length > 0) out.push(...leafEntries(v, p));
    else out.push([p, v]);
  }
  return out;
}

/**
 * Compare `config` (overrides applied, interpolations unresolved) with `defaults` (the composed
 * config before value overrides): throws one ConfigError naming every not-built feature that was set.
 */
export function checkKeyKinds(defaults: ConfigNode, config: ConfigNode): KeyReport {
  const report: KeyReport = { inert: [], unread: [] };
  const notBuilt: string[] = [];
  for (const [key, value] of leafEntries(config)) {
    const dflt = getPath(defaults, key);
    if (dflt !== undefined && deepEqual(dflt, value)) continue;
    const rule: KeyRule | undefined = ruleFor(key);
    if (!rule) {
      if (dflt === undefined) report.unread.push(key);
      continue; // a changed key with no rule is caught by the declaration test
    }
    if (rule.kind === "not_built") notBuilt.push(`${key}=${JSON.stringify(value)}: ${rule.what} is not built in verl-ts`);
    else if (rule.kind === "inert") report.inert.push({ key, value, what: rule.what });
  }
  if (notBuilt.length > 0) {
    throw new ConfigError(`these settings need verl features that verl-ts does not have (set them back to their defaults):\n  - ${notBuilt.join("\n  - ")}`);
  }
  return report;
}

/** The one start-up warning for a report, or undefined when there is nothing to say. */
export function keyReportWarning(report: KeyReport): string | undefined {
  const parts: string[] = [];
  if (report.inert.length > 0) {
    const lines = report.inert.map((i) => `${i.key}=${JSON.stringify(i.value)} (${i.what})`);
    parts.push(`${report.inert.length} setting(s) have no effect in verl-ts (plumbing of verl's distributed engines):\n  - ${lines.join("\n  - ")}`);
  }
  if (report.unread.length > 0) {
    parts.push(`${report.unread.length} key(s) added with '+' are read by nothing in verl-ts:\n  - ${report.unread.join("\n  - ")}`);
  }
  return parts.length > 0 ? `warning: ${parts.join("\nwarning: ")}` : undefined;
}
