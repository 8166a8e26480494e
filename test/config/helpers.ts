// Temporary config folders for composition tests.
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

/** Write `files` (relative path -> YAML text) under a fresh temporary folder and return it. */
export function configDir(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "verl-config-test-"));
  for (const [rel, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, rel)), { recursive: true });
    writeFileSync(join(root, rel), text);
  }
  return root;
}
