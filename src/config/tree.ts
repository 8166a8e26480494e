// The config tree: plain nested objects and arrays of YAML scalars, addressed by
// dotted paths ("a.b.0.c"). Everything here copies rather than aliases, so a
// value shared through a YAML alias or an interpolation can never be edited twice.
import deepmerge from "deepmerge";

export type ConfigScalar = null | boolean | number | string;
export type ConfigValue = ConfigScalar | ConfigValue[] | ConfigNode;
export interface ConfigNode { [key: string]: ConfigValue }
/** A fully composed config: a plain nested object, all interpolations resolved. */
export type Config = ConfigNode;

export function isNode(v: unknown): v is ConfigNode {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** "a.b[0].c" -> ["a", "b", "0", "c"]. */
export function splitPath(path: string): string[] {
  if (path === "") return [];
  return path.replace(/\[(\d+)\]/g, ".$1").split(".");
}

export function joinPath(segments: readonly string[]): string {
  return segments.join(".");
}

/** Deep copy of a parsed YAML value; fresh objects even where the source shared one (aliases). */
export function deepCopy<T>(v: T): T {
  if (Array.isArray(v)) return v.map((x) => deepCopy(x)) as T;
  if (isNode(v)) {
    const out: ConfigNode = {};
    for (const [k, x] of Object.entries(v)) out[k] = deepCopy(x);
    return out as T;
  }
  return v;
}

function child(container: ConfigValue | undefined, seg: string): ConfigValue | undefined {
  if (Array.isArray(container)) {
    if (!/^\d+$/.test(seg)) return undefined;
    return container[Number(seg)];
  }
  if (isNode(container) && Object.prototype.hasOwnProperty.call(container, seg)) return container[seg];
  return undefined;
}

/** The value at a dotted path, or undefined when any segment is missing. */
export function getPath(cfg: ConfigValue, path: string | readonly string[]): ConfigValue | undefined {
  let cur: ConfigValue | undefined = cfg;
  for (const seg of typeof path === "string" ? splitPath(path) : path) {
    cur = child(cur, seg);
    if (cur === undefined) return undefined;
  }
  return cur;
}

export function hasPath(cfg: ConfigValue, path: string | readonly string[]): boolean {
  return getPath(cfg, path) !== undefined;
}

/**
 * Set a value, creating missing intermediate mappings when `create` is true.
 * Returns false when the parent does not exist (and `create` is false) or is a scalar.
 */
export function setPath(cfg: ConfigNode, segments: readonly string[], value: ConfigValue, create: boolean): boolean {
  let cur: ConfigValue = cfg;
  for (let i = 0; i < segments.length - 1; i++) {
    const seg = segments[i]!;
    let next = child(cur, seg);
    if (next === undefined || next === null) {
      if (!create || !isNode(cur)) return false;
      next = {};
      cur[seg] = next;
    }
    if (!isNode(next) && !Array.isArray(next)) return false;
    cur = next;
  }
  const last = segments[segments.length - 1]!;
  if (Array.isArray(cur)) {
    if (!/^\d+$/.test(last) || Number(last) > cur.length) return false;
    cur[Number(last)] = value;
    return true;
  }
  if (!isNode(cur)) return false;
  cur[last] = value;
  return true;
}

/** Remove the key at a path; returns false when it was not there. */
export function deletePath(cfg: ConfigNode, segments: readonly string[]): boolean {
  const parent = getPath(cfg, segments.slice(0, -1));
  const last = segments[segments.length - 1]!;
  if (Array.isArray(parent) && /^\d+$/.test(last) && Number(last) < parent.length) {
    parent.splice(Number(last), 1);
    return true;
  }
  if (isNode(parent) && Object.prototype.hasOwnProperty.call(parent, last)) {
    delete parent[last];
    return true;
  }
  return false;
}

/** Later layers win; lists are replaced, not concatenated (as OmegaConf merges). */
export function mergeConfigs(base: ConfigNode, over: ConfigNode): ConfigNode {
  const merged = deepmerge<ConfigNode>(base, over, {
    arrayMerge: (_target: unknown[], source: unknown[]) => source,
    isMergeableObject: isNode,
  });
  // deepmerge passes lists and scalars through by reference; cut every link to the inputs.
  return deepCopy(merged);
}

/** Nest a mapping under a dotted package path: ("a.b", {x:1}) -> {a:{b:{x:1}}}. */
export function wrapAtPackage(pkg: string, content: ConfigNode): ConfigNode {
  let out: ConfigNode = content;
  for (const seg of splitPath(pkg).reverse()) out = { [seg]: out };
  return out;
}

/** Every dotted path of mappings and leaves (list items are not enumerated). */
export function listPaths(cfg: ConfigNode, prefix = ""): string[] {
  const out: string[] = [];
  for (const [k, v] of Object.entries(cfg)) {
    const p = prefix ? `${prefix}.${k}` : k;
    out.push(p);
    if (isNode(v)) out.push(...listPaths(v, p));
  }
  return out;
}

export function deepEqual(a: ConfigValue | undefined, b: ConfigValue | undefined): boolean {
  if (a === b) return true;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => deepEqual(x, b[i]));
  if (isNode(a) && isNode(b)) {
    const ka = Object.keys(a), kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k) => deepEqual(a[k], b[k]));
  }
  return false;
}
