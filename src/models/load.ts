// One entry point for a model path: a llama2.c checkpoint file or a Hugging Face folder.
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { loadHfModel } from "./hf.js";
import type { LlamaModel } from "./llama.js";
import { loadLlama2c } from "./llama2c.js";

export async function loadModel(path: string): Promise<LlamaModel> {
  if (!existsSync(path)) throw new Error(`model path ${path} does not exist`);
  if (statSync(path).isFile()) {
    if (path.endsWith(".safetensors") || /(^|\/)pytorch_model[^/]*\.bin$/.test(path)) throw new Error(`${path}: pass the folder holding config.json, not the weights file`);
    return loadLlama2c(path);
  }
  if (existsSync(join(path, "config.json"))) return loadHfModel(path);
  throw new Error(`${path}: expected a llama2.c checkpoint file or a Hugging Face folder with config.json`);
}
