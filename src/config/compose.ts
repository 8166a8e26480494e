// Composition of YAML files through Hydra-style defaults lists.
//
// A config file may start with `defaults:`, a list whose entries are merged in order,
// the file's own keys landing where `_self_` stands (last when absent):
//   - name                      another config (relative to this file's group folder; "/name" from the root)
//   - group: option             <group>/<option>.yaml, placed at this file's package + group
//   - group@pkg: option         ... placed at this file's package + pkg (`_global_` for the root)
//   - optional group: option    as above, skipped when the file is missing
//   - override group: option    (primary config only) changes the option of an entry deeper in the tree
//   - _self_
// Files are looked up along the search path: --config-path, the primary config's
// `hydra.searchpath` (file://dir, or pkg://... for this package's conf/), then the package's conf/.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { basename, dirname, isAbsolute, join, posix, resolve } from "node:path";
import { parse } from "yaml";
import { packageRoot } from "../utils/paths.js";
import { ConfigError } from "./errors.js";
import { deepCopy, isNode, mergeConfigs, wrapAtPackage, type ConfigNode } from "./tree.js";

/** A `group=option` choice from the command line or an `override` entry. */
export interface GroupChoice {
  key: string;
  option: string;
  raw: string;
  used: boolean;
}

export interface ComposeOptions {
  configName: string;
  configPath?: string;
  groupChoices?: GroupChoice[];
  cwd?: string;
}

export const packageConfDir = (): string => join(packageRoot, "conf");

interface Loaded {
  file: string;
  content: ConfigNode;
  defaults: unknown[];
  headerPackage?: string;
  searchpath: string[];
}

function readYamlFile(file: string): Loaded {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new ConfigError(`cannot read config file ${file}: ${(e as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = parse(text, { merge: true });
  } catch (e) {
    throw new ConfigError(`cannot parse config file ${file}: ${(e as Error).message}`);
  }
  if (doc === null || doc === undefined) doc = {};
  if (!isNode(doc)) throw new ConfigError(`config file ${file} must hold a mapping at the top, found ${Array.isArray(doc) ? "a list" : typeof doc}`);
  // Aliases parse to one shared object; copy so each use is its own.
  const content = deepCopy(doc);
  const defaults = content.defaults ?? [];
  if (!Array.isArray(defaults)) throw new ConfigError(`${file}: 'defaults' must be a list`);
  delete content.defaults;
  let searchpath: string[] = [];
  const hydra = content.hydra;
  if (isNode(hydra)) {
    const sp = hydra.searchpath ?? [];
    if (!Array.isArray(sp) || sp.some((x) => typeof x !== "string")) throw new ConfigError(`${file}: hydra.searchpath must be a list of strings`);
    searchpath = sp as string[];
  }
  delete content.hydra;
  const header = /^(?:#[^\n]*\n|\s*\n)*?#\s*@package\s+(\S+)/.exec(text);
  return { file, content, defaults, headerPackage: header?.[1], searchpath };
}

function joinPkg(parent: string, child: string): string {
  return [parent, child].filter((s) => s !== "").join(".");
}

class SearchPath {
  constructor(readonly dirs: string[]) {}

  find(relFile: string): string | undefined {
    for (const d of this.dirs) {
      const p = join(d, relFile);
      if (existsSync(p) && statSync(p).isFile()) return p;
    }
    return undefined;
  }

  options(group: string): string[] {
    const names = new Set<string>();
    for (const d of this.dirs) {
      const dir = join(d, group);
      if (!existsSync(dir) || !statSync(dir).isDirectory()) continue;
      for (const f of readdirSync(dir)) if (f.endsWith(".yaml")) names.add(f.slice(0, -5));
    }
    return [...names].sort();
  }
}

/** Turn one hydra.searchpath entry into a folder. */
function searchDir(entry: string, primaryDir: string, cwd: string): string {
  if (entry.startsWith("pkg://")) return packageConfDir();
  const p = entry.startsWith("file://") ? entry.slice(7) : entry;
  if (isAbsolute(p)) return p;
  const fromCwd = resolve(cwd, p);
  return existsSync(fromCwd) ? fromCwd : resolve(primaryDir, p);
}

interface Entry {
  kind: "self" | "config" | "group";
  group: string; // folder of the file, relative to a search dir
  option: string;
  pkg: string;
  optional: boolean;
  writtenGroup: string; // as the user can name it on the command line
}

class Composer {
  private readonly layers: { pkg: string; content: ConfigNode }[] = [];
  private readonly stack: string[] = [];

  constructor(private readonly sp: SearchPath, private readonly choices: GroupChoice[]) {}

  /** Parse one defaults-list item written in `file` (whose group folder is `group`, package `pkg`). */
  private entry(item: unknown, file: string, group: string, pkg: string, primary: boolean): Entry | undefined {
    if (item === "_self_") return { kind: "self", group, option: "", pkg, optional: false, writtenGroup: "" };
    if (typeof item === "string") {
      const [path, at] = item.split("@") as [string, string | undefined];
      const full = path.startsWith("/") ? path.slice(1) : posix.join(group, path);
      const relGroup = posix.dirname(path.replace(/^\//, ""));
      const childPkg = at !== undefined ? this.packageOf(at, pkg) : joinPkg(pkg, relGroup === "." ? "" : relGroup.replace(/\//g, "."));
      return { kind: "config", group: posix.dirname(full) === "." ? "" : posix.dirname(full), option: posix.basename(full), pkg: childPkg, optional: false, writtenGroup: "" };
    }
    if (!isNode(item) || Object.keys(item).length !== 1) {
      throw new ConfigError(`${file}: defaults entry ${JSON.stringify(item)} must be a name, _self_, or a single 'group: option' pair`);
    }
    const [rawKey, value] = Object.entries(item)[0]!;
    const words = rawKey.trim().split(/\s+/);
    const spec = words.pop()!;
    const flags = new Set(words);
    for (const f of flags) if (f !== "optional" && f !== "override") throw new ConfigError(`${file}: unknown keyword '${f}' in defaults entry '${rawKey}'`);
    if (flags.has("override")) {
      if (!primary) throw new ConfigError(`${file}: 'override ${spec}' is only allowed in the primary config's defaults list`);
      return undefined; // collected up front by compose()
    }
    if (value === null) return undefined; // `group: null` selects nothing
    if (typeof value !== "string") throw new ConfigError(`${file}: defaults entry '${rawKey}' must name one option (a string), got ${JSON.stringify(value)}`);
    const [groupPart, at] = spec.split("@") as [string, string | undefined];
    const groupPath = groupPart.startsWith("/") ? groupPart.slice(1) : posix.normalize(posix.join(group, groupPart));
    if (groupPath.startsWith("..")) throw new ConfigError(`${file}: group '${groupPart}' climbs above the config root`);
    const relName = groupPart.replace(/^\/|^(\.\.\/)+/g, "");
    const childPkg = at !== undefined ? this.packageOf(at, pkg) : joinPkg(pkg, relName.replace(/\//g, "."));
    return { kind: "group", group: groupPath, option: value, pkg: childPkg, optional: flags.has("optional"), writtenGroup: groupPath };
  }

  private packageOf(at: string, parentPkg: string): string {
    if (at === "_global_") return "";
    if (at.startsWith("_global_.")) return at.slice("_global_.".length);
    return joinPkg(parentPkg, at);
  }

  /** The command-line choice for a group entry, if one names it (by group, package path, or group@package). */
  private choiceFor(e: Entry): GroupChoice | undefined {
    const names = new Set([e.group, e.pkg.replace(/\./g, "/"), `${e.group}@${e.pkg}`]);
    let found: GroupChoice | undefined;
    for (const c of this.choices) {
      if (names.has(c.key.replace(/^\//, ""))) {
        c.used = true;
        found = c; // the last one written wins, as with repeated overrides
      }
    }
    return found;
  }

  add(loaded: Loaded, group: string, pkg: string, primary: boolean): void {
    if (this.stack.includes(loaded.file)) throw new ConfigError(`defaults cycle: ${[...this.stack, loaded.file].join(" -> ")}`);
    this.stack.push(loaded.file);
    const ownPkg = loaded.headerPackage === undefined || loaded.headerPackage === "_group_" ? pkg : this.packageOf(loaded.headerPackage, "");
    let selfDone = false;
    for (const item of loaded.defaults) {
      const e = this.entry(item, loaded.file, group, pkg, primary);
      if (!e) continue;
      if (e.kind === "self") {
        this.layers.push({ pkg: ownPkg, content: loaded.content });
        selfDone = true;
        continue;
      }
      const option = e.kind === "group" ? (this.choiceFor(e)?.option ?? e.option) : e.option;
      const rel = posix.join(e.group, `${option}.yaml`);
      const file = this.sp.find(rel);
      if (!file) {
        if (e.optional) continue;
        const what = e.kind === "group" ? `option '${option}' of config group '${e.group}'` : `config '${rel.slice(0, -5)}'`;
        const known = e.kind === "group" ? this.sp.options(e.group) : [];
        throw new ConfigError(`${loaded.file}: cannot find ${what} (looked in ${this.sp.dirs.join(", ")})${known.length ? `; available: ${known.join(", ")}` : ""}`);
      }
      this.add(readYamlFile(file), e.group, e.pkg, false);
    }
    if (!selfDone) this.layers.push({ pkg: ownPkg, content: loaded.content });
    this.stack.pop();
  }

  result(): ConfigNode {
    let out: ConfigNode = {};
    for (const l of this.layers) out = mergeConfigs(out, wrapAtPackage(l.pkg, l.content));
    return out;
  }
}

/** The names of root configs along a search path (for error messages). */
function rootConfigs(dirs: string[]): string[] {
  const names = new Set<string>();
  for (const d of dirs) if (existsSync(d)) for (const f of readdirSync(d)) if (f.endsWith(".yaml")) names.add(f.slice(0, -5));
  return [...names].sort();
}

/** Compose the named root config (no overrides of values yet, no interpolation). */
export function composeConfig(opts: ComposeOptions): ConfigNode {
  const cwd = opts.cwd ?? process.cwd();
  const conf = packageConfDir();
  const dirs: string[] = [];
  if (opts.configPath !== undefined) {
    const d = resolve(cwd, opts.configPath);
    if (!existsSync(d) || !statSync(d).isDirectory()) throw new ConfigError(`--config-path ${opts.configPath}: no such folder (${d})`);
    dirs.push(d);
  }
  let name = opts.configName;
  // --config-name may also be a path to a YAML file; its folder then leads the search path.
  if (name.endsWith(".yaml") || name.endsWith(".yml")) {
    const f = resolve(dirs[0] ?? cwd, name);
    if (existsSync(f)) {
      dirs.unshift(dirname(f));
      name = basename(f).replace(/\.ya?ml$/, "");
    } else name = name.replace(/\.ya?ml$/, "");
  }
  const initial = new SearchPath([...dirs, conf]);
  const primaryFile = initial.find(`${name}.yaml`);
  if (!primaryFile) {
    throw new ConfigError(`cannot find config '${name}' (looked in ${initial.dirs.join(", ")}); available: ${rootConfigs(initial.dirs).join(", ")}`);
  }
  const primary = readYamlFile(primaryFile);
  const extra = primary.searchpath.map((s) => searchDir(s, dirname(primaryFile), cwd));
  const sp = new SearchPath([...new Set([...dirs, dirname(primaryFile), ...extra, conf])]);
  // `override group: option` entries of the primary config act like command-line choices, which still win.
  const choices: GroupChoice[] = [];
  for (const item of primary.defaults) {
    if (!isNode(item) || Object.keys(item).length !== 1) continue;
    const [k, v] = Object.entries(item)[0]!;
    const words = k.trim().split(/\s+/);
    if (words[0] === "override" && words.length === 2 && typeof v === "string") choices.push({ key: words[1]!, option: v, raw: `${k}: ${v}`, used: false });
  }
  const cli = opts.groupChoices ?? [];
  const composer = new Composer(sp, [...choices, ...cli]);
  composer.add(primary, "", "", true);
  for (const c of choices) if (!c.used) throw new ConfigError(`${primaryFile}: '${c.raw}' overrides a config group that is not in the defaults list`);
  return composer.result();
}
