// User classes named in YAML (agent loops, tools, interactions) are spelled
// "path/to/module.js#ExportName": a file path (absolute, or relative to the
// YAML file that names it, else to the working directory) or a package
// specifier, then '#', then the export. Without '#', the default export.
// Built-in classes are found by name first (their verl dotted name works too).
import { existsSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";

export interface LoadExportOptions {
  /** Directory relative module paths resolve against (the YAML file's folder). */
  baseDir?: string;
  /** Built-in exports by name. */
  builtins?: ReadonlyMap<string, unknown>;
  /** What is being loaded, for error messages ("tool class_name"). */
  what: string;
}

function looksLikePath(s: string): boolean {
  return s.includes("/") || s.includes("\\") || /\.(m|c)?(j|t)s$/.test(s);
}

function moduleUrl(modulePart: string, baseDir: string | undefined): string {
  if (isAbsolute(modulePart)) return pathToFileURL(modulePart).href;
  const base = baseDir ?? process.cwd();
  const local = resolve(base, modulePart);
  if (modulePart.startsWith(".") || existsSync(local)) return pathToFileURL(local).href;
  if (baseDir !== undefined) {
    const fromCwd = resolve(process.cwd(), modulePart);
    if (existsSync(fromCwd)) return pathToFileURL(fromCwd).href;
  }
  return modulePart; // a package specifier
}

/** Load the value a spec names; errors name the spec and what was expected. */
export async function loadExport(spec: string, opts: LoadExportOptions): Promise<unknown> {
  if (typeof spec !== "string" || spec.length === 0) throw new Error(`${opts.what} must be a non-empty string, got ${JSON.stringify(spec)}`);
  const builtin = opts.builtins?.get(spec);
  if (builtin !== undefined) return builtin;
  const hash = spec.lastIndexOf("#");
  if (hash < 0 && !looksLikePath(spec)) {
    const known = [...(opts.builtins?.keys() ?? [])].join(", ") || "none";
    throw new Error(`${opts.what} '${spec}' is not a built-in (known: ${known}) and not a 'path/to/module.js#ExportName' spec`);
  }
  const modulePart = hash < 0 ? spec : spec.slice(0, hash);
  const exportName = hash < 0 ? "default" : spec.slice(hash + 1);
  if (!modulePart || !exportName) throw new Error(`${opts.what} '${spec}': expected 'path/to/module.js#ExportName'`);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(moduleUrl(modulePart, opts.baseDir))) as Record<string, unknown>;
  } catch (e) {
    throw new Error(`${opts.what} '${spec}': cannot import '${modulePart}': ${(e as Error).message}`);
  }
  const value = mod[exportName];
  if (value === undefined) {
    throw new Error(`${opts.what} '${spec}': module '${modulePart}' has no export '${exportName}' (exports: ${Object.keys(mod).join(", ") || "none"})`);
  }
  return value;
}

/** Like loadExport, but the value must be a class (constructor function). */
export async function loadClass<T>(spec: string, opts: LoadExportOptions): Promise<new (...args: never[]) => T> {
  const value = await loadExport(spec, opts);
  if (typeof value !== "function") throw new Error(`${opts.what} '${spec}' is not a class (got ${typeof value})`);
  return value as new (...args: never[]) => T;
}
