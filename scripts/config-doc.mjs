#!/usr/bin/env node
// Rewrites the generated key-kind tables of docs/configuration.md from src/config/key_kinds.ts (run after `npx tsc`).
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const { withKeyKindsDoc } = await import(join(root, "dist/src/config/key_kinds_doc.js"));
const page = join(root, "docs/configuration.md");
writeFileSync(`${page}.tmp`, withKeyKindsDoc(readFileSync(page, "utf8")));
renameSync(`${page}.tmp`, page);
console.log("docs/configuration.md: key-kind tables regenerated");
