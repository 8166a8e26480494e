// Reads the YAML files this layer takes (tool, interaction and agent-loop
// configs) with errors that name the file.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { parse } from "yaml";

export function readYamlFile(path: string, what: string): { data: unknown; absPath: string } {
  const absPath = resolve(path);
  let text: string;
  try {
    text = readFileSync(absPath, "utf8");
  } catch (e) {
    throw new Error(`cannot read ${what} ${path}: ${(e as Error).message}`);
  }
  try {
    return { data: parse(text, { merge: true }) as unknown, absPath };
  } catch (e) {
    throw new Error(`${what} ${path} is not valid YAML: ${(e as Error).message}`);
  }
}

export function isMapping(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
