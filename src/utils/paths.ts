// Where things live: the package root (for conf/), and ../shared beside the
// checkout (reference data and models that are never part of the project).
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The package root: the folder holding package.json and conf/. */
export const packageRoot: string = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 6; i++) {
    if (existsSync(join(dir, "package.json")) && existsSync(join(dir, "conf"))) return dir;
    dir = dirname(dir);
  }
  throw new Error(`cannot find the verl-ts package root above ${fileURLToPath(import.meta.url)}`);
})();

/** ../shared beside the checkout, or VERL_SHARED_DIR. */
export function sharedDir(): string {
  return resolve(process.env.VERL_SHARED_DIR ?? join(packageRoot, "..", "shared"));
}

/** A path under ../shared if it exists, else undefined (tests skip with a message). */
export function sharedPath(...parts: string[]): string | undefined {
  const p = join(sharedDir(), ...parts);
  return existsSync(p) ? p : undefined;
}
