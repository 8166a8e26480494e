// OmegaConf-style interpolation, resolved once over the whole tree after overrides:
//   ${a.b}  ${.sibling}  ${..uncle}  ${oc.select:path,default}  ${oc.env:VAR,default}  ${oc.decode:text}
// A value that is exactly one interpolation keeps the target's type (number, list, ...);
// interpolations embedded in longer text are stringified. "\${" is a literal "${".
import { ConfigError } from "./errors.js";
import { parseOverrideValue } from "./overrides.js";
import { unknownKeyHint } from "./suggest.js";
import { deepCopy, isNode, joinPath, splitPath, type ConfigNode, type ConfigValue } from "./tree.js";

type Part = { text: string } | { expr: string };

/** Split "a${x}b${y.${z}}" into literal and expression parts, honouring nesting and "\${". */
function splitTemplate(s: string, owner: string): Part[] {
  const parts: Part[] = [];
  let text = "";
  let i = 0;
  while (i < s.length) {
    if (s.startsWith("\\${", i)) {
      text += "${";
      i += 3;
    } else if (s.startsWith("${", i)) {
      let depth = 1, j = i + 2;
      for (; j < s.length && depth > 0; j++) {
        if (s.startsWith("${", j)) { depth++; j++; }
        else if (s[j] === "}") depth--;
      }
      if (depth !== 0) throw new ConfigError(`${owner}: unterminated interpolation in ${JSON.stringify(s)}`);
      if (text) parts.push({ text });
      text = "";
      parts.push({ expr: s.slice(i + 2, j - 1).trim() });
      i = j;
    } else {
      text += s[i];
      i++;
    }
  }
  if (text) parts.push({ text });
  return parts;
}

/** Split resolver arguments at top-level commas (not inside ${...}, [...], {...} or quotes). */
function splitArgs(s: string): string[] {
  const args: string[] = [];
  let depth = 0, quote = "", cur = "";
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (quote) { if (c === quote) quote = ""; cur += c; continue; }
    if (c === "'" || c === '"') quote = c;
    else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") depth--;
    else if (c === "," && depth === 0) { args.push(cur.trim()); cur = ""; continue; }
    cur += c;
  }
  args.push(cur.trim());
  return args;
}

function stringify(v: ConfigValue): string {
  if (v === null) return "null";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

const RESOLVERS = ["oc.select", "oc.env", "oc.decode"] as const;

class Resolver {
  private readonly done = new Map<string, ConfigValue>();
  private readonly active: string[] = [];

  constructor(private readonly root: ConfigNode) {}

  /** The resolved value at a path, or undefined if the path does not exist. */
  resolvePath(segs: readonly string[]): ConfigValue | undefined {
    const key = joinPath(segs);
    const hit = this.done.get(key);
    if (hit !== undefined) return hit;
    // Walk down, resolving any interpolated container on the way (a key may point into ${other.mapping}).
    let cur: ConfigValue = this.root;
    for (let i = 0; i < segs.length; i++) {
      const seg = segs[i]!;
      let next: ConfigValue | undefined;
      if (Array.isArray(cur)) next = /^\d+$/.test(seg) ? cur[Number(seg)] : undefined;
      else if (isNode(cur) && Object.prototype.hasOwnProperty.call(cur, seg)) next = cur[seg];
      if (next === undefined) return undefined;
      if (typeof next === "string" && i < segs.length - 1 && next.includes("${")) next = this.resolveKey(segs.slice(0, i + 1), next);
      cur = next;
    }
    return this.resolveKey(segs, cur);
  }

  private resolveKey(segs: readonly string[], raw: ConfigValue): ConfigValue {
    const key = joinPath(segs);
    const hit = this.done.get(key);
    if (hit !== undefined) return hit;
    if (this.active.includes(key)) {
      const cycle = [...this.active.slice(this.active.indexOf(key)), key].map((k) => k || "<root>").join(" -> ");
      throw new ConfigError(`interpolation cycle: ${cycle}`);
    }
    this.active.push(key);
    let out: ConfigValue;
    try {
      if (Array.isArray(raw)) out = raw.map((v, i) => this.resolveKey([...segs, String(i)], v));
      else if (isNode(raw)) {
        const node: ConfigNode = {};
        for (const [k, v] of Object.entries(raw)) node[k] = this.resolveKey([...segs, k], v);
        out = node;
      } else if (typeof raw === "string" && raw.includes("${")) out = this.resolveString(raw, segs);
      else out = raw;
    } finally {
      this.active.pop();
    }
    this.done.set(key, out);
    return out;
  }

  private resolveString(s: string, owner: readonly string[]): ConfigValue {
    const parts = splitTemplate(s, joinPath(owner));
    if (parts.length === 1 && "expr" in parts[0]!) return deepCopy(this.evaluate(parts[0].expr, owner));
    return parts.map((p) => ("text" in p ? p.text : stringify(this.evaluate(p.expr, owner)))).join("");
  }

  private evaluate(expr: string, owner: readonly string[]): ConfigValue {
    const ownerKey = joinPath(owner);
    // Nested interpolations inside the expression resolve first: ${oc.select:${which},1}, ${a.${b}}.
    const m = /^([A-Za-z_][\w.]*):([\s\S]*)$/.exec(expr);
    if (!m) {
      const path = this.resolveString(expr, owner);
      const target = this.absolute(String(path), owner);
      const v = this.resolvePath(target);
      if (v === undefined) {
        throw new ConfigError(`${ownerKey}: interpolation \${${expr}} points at '${joinPath(target)}', which does not exist; ${unknownKeyHint(this.root, joinPath(target))}`);
      }
      if (v === "???") throw new ConfigError(`${ownerKey}: interpolation \${${expr}} points at '${joinPath(target)}', which is mandatory (???) and was not set`);
      return v;
    }
    const name = m[1]!;
    const args = splitArgs(m[2]!).map((a) => this.argValue(a, owner));
    switch (name) {
      case "oc.select": {
        if (args.length < 1 || args.length > 2) throw new ConfigError(`${ownerKey}: \${oc.select:PATH,DEFAULT} takes one or two arguments, got ${args.length}`);
        const target = this.absolute(String(args[0]), owner);
        const v = this.resolvePath(target);
        return v === undefined || v === "???" ? (args[1] ?? null) : v;
      }
      case "oc.env": {
        if (args.length < 1 || args.length > 2) throw new ConfigError(`${ownerKey}: \${oc.env:VAR,DEFAULT} takes one or two arguments, got ${args.length}`);
        const env = process.env[String(args[0])];
        if (env !== undefined) return env;
        if (args.length === 2) return args[1]!;
        throw new ConfigError(`${ownerKey}: environment variable ${String(args[0])} is not set and \${${expr}} gives no default`);
      }
      case "oc.decode":
        if (args.length !== 1) throw new ConfigError(`${ownerKey}: \${oc.decode:TEXT} takes one argument, got ${args.length}`);
        return typeof args[0] === "string" ? parseOverrideValue(args[0]) : args[0]!;
      default:
        throw new ConfigError(`${ownerKey}: unknown resolver '${name}' in \${${expr}} (known: ${RESOLVERS.join(", ")})`);
    }
  }

  /** A resolver argument: nested interpolations resolved, quotes stripped, bare words typed like YAML scalars. */
  private argValue(a: string, owner: readonly string[]): ConfigValue {
    if (a.length >= 2 && (a[0] === "'" || a[0] === '"') && a[a.length - 1] === a[0]) return a.slice(1, -1);
    if (a.includes("${")) return this.resolveString(a, owner);
    return parseOverrideValue(a);
  }

  /** Relative paths: ".x" is a sibling of the owning key, "..x" a sibling of its parent, and so on. */
  private absolute(path: string, owner: readonly string[]): string[] {
    const dots = /^\.*/.exec(path)![0].length;
    if (dots === 0) return splitPath(path);
    if (dots > owner.length) throw new ConfigError(`${joinPath(owner)}: relative interpolation '${path}' climbs above the root`);
    const rest = path.slice(dots);
    return [...owner.slice(0, owner.length - dots), ...(rest ? splitPath(rest) : [])];
  }
}

/** A new tree with every interpolation resolved. */
export function resolveConfig(cfg: ConfigNode): ConfigNode {
  return new Resolver(cfg).resolvePath([]) as ConfigNode;
}

/** The resolved value at one key (undefined if absent); other keys are resolved only as needed. */
export function resolveAt(cfg: ConfigNode, key: string): ConfigValue | undefined {
  return new Resolver(cfg).resolvePath(splitPath(key));
}
