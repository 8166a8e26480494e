// verl's weight sync for the llama_cpp engine: when the actor's weights changed
// since the last rollout, write them as a GGUF file to a RAM disk and load it into
// llama.cpp (the old model is released first, so one copy lives at a time).
import { existsSync, rmSync, statfsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { LlamaModel } from "../../models/llama.js";
import type { Tokenizer } from "../../models/tokenizer.js";
import { numParams } from "../../models/config.js";
import { writeGguf, type GgufWeightType } from "../../models/gguf.js";
import { ggufVocab } from "../../models/gguf_vocab.js";
import { paramIds, sameIds } from "../decode_weights.js";
import { mergedWeight } from "../../models/merge.js";
import type { Llama, LlamaModelHandle } from "./binding.js";

/** Free bytes under `dir` (Infinity when the file system cannot tell). */
function freeBytes(dir: string): number {
  try {
    const s = statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return Infinity;
  }
}

// a RAM disk outlives the process: remove the weight files on exit too
const exitCleanup = new Set<string>();
process.once("exit", () => { for (const p of exitCleanup) rmSync(p, { force: true }); });

export interface WeightSyncOptions {
  weightType: GgufWeightType;
  /** Where the GGUF goes: a RAM disk by default; the system temp dir when it lacks room. */
  dir: string;
  gpuLayers: number | "max";
  tag: string;
}

export class GgufWeightSync {
  private ids: object[] = [];
  private handle: LlamaModelHandle | undefined;
  private path: string | undefined;
  /** Seconds spent writing and loading in the last sync (0 when nothing changed). */
  lastSyncSeconds = 0;

  constructor(private readonly llama: Llama, private readonly opts: WeightSyncOptions) {}

  /** The llama.cpp model holding `model`'s current weights; `changed` when it was just reloaded. */
  async current(model: LlamaModel, tokenizer: Tokenizer): Promise<{ handle: LlamaModelHandle; changed: boolean }> {
    const ids = paramIds(model);
    if (this.handle && sameIds(ids, this.ids)) { this.lastSyncSeconds = 0; return { handle: this.handle, changed: false }; }
    const t0 = performance.now();
    await this.release();
    const c = model.config;
    const bytes = numParams(c) * (this.opts.weightType === "f16" ? 2 : 4) + 64 * 2 ** 20;
    const dir = existsSync(this.opts.dir) && freeBytes(this.opts.dir) > bytes ? this.opts.dir : tmpdir();
    const path = join(dir, `verl-ts-rollout-${process.pid}-${this.opts.tag}.gguf`);
    const read = (name: string) => mergedWeight(model, name);
    await writeGguf(path, c, ggufVocab(tokenizer, c.vocabSize), read, { weightType: this.opts.weightType });
    this.path = path;
    exitCleanup.add(path);
    // a parameter may have changed while we read: keep the ids we read from
    this.ids = ids;
    this.handle = await this.llama.loadModel({ modelPath: path, gpuLayers: this.opts.gpuLayers, useMmap: true, checkTensors: false });
    this.lastSyncSeconds = (performance.now() - t0) / 1000;
    return { handle: this.handle, changed: true };
  }

  async release(): Promise<void> {
    const h = this.handle;
    this.handle = undefined;
    this.ids = [];
    if (h) await h.dispose();
    if (this.path) { rmSync(this.path, { force: true }); exitCleanup.delete(this.path); }
    this.path = undefined;
  }
}
