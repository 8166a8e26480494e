// The fenced shell blocks of README.md and docs/*.md, with the doc-test directive that precedes each
// (docs/contributing.md): `<!-- doc-test: skip REASON -->` (not run) or
// `<!-- doc-test: smoke VAR=VALUE ... -->` (run with that env, which shrinks the run).
import { readFileSync } from "node:fs";

export interface DocBlock {
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  code: string;
  skip?: string;
  smoke: Record<string, string>;
}

const SHELL = new Set(["bash", "sh", "shell"]);
const DIRECTIVE = /^<!--\s*doc-test:\s*(\S+)\s*(.*?)\s*-->$/;

/** The blocks of one Markdown text; a malformed directive is an error naming the file and line. */
export function parseDocBlocks(file: string, text: string): DocBlock[] {
  const lines = text.split("\n");
  const out: DocBlock[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([\w-]*)/.exec(lines[i]!);
    if (!open) continue;
    const fence = open[2]!;
    let end = i + 1;
    while (end < lines.length && !lines[end]!.trimStart().startsWith(fence)) end++;
    const lang = open[3]!.toLowerCase();
    if (SHELL.has(lang)) {
      let prev = i - 1;
      while (prev >= 0 && lines[prev]!.trim() === "") prev--;
      const block: DocBlock = { file, line: i + 1, code: lines.slice(i + 1, end).join("\n"), smoke: {} };
      const m = prev >= 0 ? DIRECTIVE.exec(lines[prev]!.trim()) : null;
      if (m) {
        const [, kind, rest] = m;
        if (kind === "skip") {
          if (!rest) throw new Error(`${file}:${prev + 1}: <!-- doc-test: skip --> needs a reason`);
          block.skip = rest;
        } else if (kind === "smoke") {
          for (const pair of rest!.split(/\s+/).filter(Boolean)) {
            const eq = pair.indexOf("=");
            if (eq <= 0 || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(pair.slice(0, eq))) {
              throw new Error(`${file}:${prev + 1}: doc-test smoke takes VAR=VALUE pairs, got '${pair}'`);
            }
            block.smoke[pair.slice(0, eq)] = pair.slice(eq + 1);
          }
          if (Object.keys(block.smoke).length === 0) throw new Error(`${file}:${prev + 1}: doc-test smoke needs at least one VAR=VALUE`);
        } else {
          throw new Error(`${file}:${prev + 1}: unknown doc-test directive '${kind}' (skip REASON or smoke VAR=VALUE ...)`);
        }
      }
      out.push(block);
    }
    i = end;
  }
  return out;
}

/** A non-shell block whose first line is a comment naming a file (`// my_algos.mjs`, `# my_reward.py, ...`). */
export interface DocFile { file: string; line: number; name: string; text: string }

const FILE_COMMENT = /^(?:\/\/|#)\s*([\w./-]+\.(?:mjs|cjs|js|mts|ts|py|yaml|yml|json))\b/;

/** The files a page writes out in code blocks; the doc test puts them in the page's folder first. */
export function parseDocFiles(file: string, text: string): DocFile[] {
  const lines = text.split("\n");
  const out: DocFile[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(`{3,}|~{3,})\s*([\w-]*)/.exec(lines[i]!);
    if (!open) continue;
    let end = i + 1;
    while (end < lines.length && !lines[end]!.startsWith(open[1]!)) end++;
    const m = SHELL.has(open[2]!.toLowerCase()) ? null : FILE_COMMENT.exec(lines[i + 1] ?? "");
    if (m && !m[1]!.startsWith("/") && !m[1]!.split("/").includes("..")) {
      out.push({ file, line: i + 1, name: m[1]!, text: lines.slice(i + 1, end).join("\n") + "\n" });
    }
    i = end;
  }
  return out;
}

export function readDocBlocks(path: string, name: string): DocBlock[] {
  return parseDocBlocks(name, readFileSync(path, "utf8"));
}
