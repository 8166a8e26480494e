import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { keyKindsDoc } from "../../src/config/key_kinds_doc.js";
import { packageRoot } from "../../src/utils/paths.js";

test("docs/configuration.md carries the key-kind tables as key_kinds.ts declares them (run scripts/config-doc.mjs)", () => {
  const page = readFileSync(join(packageRoot, "docs/configuration.md"), "utf8");
  assert.ok(page.includes(keyKindsDoc()), "the generated block is stale: npx tsc && node scripts/config-doc.mjs");
});
