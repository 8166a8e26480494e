// loadTokenizer: one entry point for every tokenizer format verl-ts reads.
import { existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Tokenizer } from "../tokenizer.js";
import { CharTokenizer, CHAR_TOKENIZER_TYPE } from "./char.js";
import { HfTokenizer } from "./hf.js";
import { Llama2cTokenizer } from "./llama2c.js";

export { CharTokenizer, DEFAULT_CHAR_CHAT_TEMPLATE, CHAR_SPECIAL_TOKENS } from "./char.js";
export { HfTokenizer } from "./hf.js";
export { Llama2cTokenizer, parseLlama2cTokenizer } from "./llama2c.js";
export { llama2cToHfJson } from "./llama2c_export.js";
export { checkChatTemplate, renderChatTemplate } from "./chat_template.js";

const LLAMA2C_NAMES = ["tokenizer.bin", "tok512.bin"];

function chatTemplateFrom(dir: string): string | undefined {
  const jinja = join(dir, "chat_template.jinja");
  if (existsSync(jinja)) return readFileSync(jinja, "utf8");
  const cfg = join(dir, "tokenizer_config.json");
  if (!existsSync(cfg)) return undefined;
  const t = (JSON.parse(readFileSync(cfg, "utf8")) as { chat_template?: unknown }).chat_template;
  return typeof t === "string" ? t : undefined;
}

/**
 * Load a tokenizer from:
 * - `char:<alphabet>` (escapes \n \t \\);
 * - a llama2.c `.bin` file (tok512.bin);
 * - a folder with tokenizer.bin / tok512.bin (llama2.c; preferred over a tokenizer.json beside it, which our export also writes);
 * - a folder with tokenizer.json: the verl-ts char tokenizer (`verl_ts_tokenizer: "char"`) or a Hugging Face tokenizer.
 */
export async function loadTokenizer(pathOrDir: string): Promise<Tokenizer> {
  if (pathOrDir.startsWith("char:")) return CharTokenizer.fromSpec(pathOrDir);
  if (!existsSync(pathOrDir)) throw new Error(`tokenizer path ${pathOrDir} does not exist`);
  if (statSync(pathOrDir).isFile()) {
    if (pathOrDir.endsWith(".bin")) return Llama2cTokenizer.fromFile(pathOrDir);
    if (pathOrDir.endsWith(".json")) return fromTokenizerJson(pathOrDir, join(pathOrDir, ".."));
    throw new Error(`tokenizer file ${pathOrDir}: expected a llama2.c .bin or a tokenizer.json`);
  }
  for (const name of LLAMA2C_NAMES) {
    const p = join(pathOrDir, name);
    if (existsSync(p)) return Llama2cTokenizer.fromFile(p, chatTemplateFrom(pathOrDir));
  }
  const json = join(pathOrDir, "tokenizer.json");
  if (existsSync(json)) return fromTokenizerJson(json, pathOrDir);
  throw new Error(
    `no tokenizer in ${pathOrDir}: expected tokenizer.json (Hugging Face or verl-ts char), or tokenizer.bin / tok512.bin (llama2.c)`,
  );
}

function fromTokenizerJson(jsonPath: string, dir: string): Tokenizer {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(jsonPath, "utf8"));
  } catch (e) {
    throw new Error(`${jsonPath} is not valid JSON: ${(e as Error).message}`);
  }
  if (typeof parsed === "object" && parsed !== null && (parsed as Record<string, unknown>).verl_ts_tokenizer === CHAR_TOKENIZER_TYPE) {
    return CharTokenizer.fromJson(parsed, jsonPath);
  }
  return HfTokenizer.fromDir(dir);
}
