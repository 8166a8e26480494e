// Rollout engines side by side (issue 17): the llama_cpp engine (llama.cpp through
// node-llama-cpp; Vulkan on a GPU, else CPU) against the host KV-cache decoder, on a
// fresh policy of a given shape, prompts of 16 random tokens, n samples each,
// sampling at temperature 1 with EOS ignored (every row generates the full length).
// The llama_cpp figure covers the whole call after the weight sync; the sync (GGUF
// write to a RAM disk + load) is reported apart. The host decoder is timed on a
// slice (--host-rows x --host-new: at 0.5B it decodes ~20 tokens/s), its rate is
// per generated token all the same.
//   node dist/bench/rollout_engines.js --shape 0.5b --prompts 64 --n 8 --new 256 --gpu vulkan --out FILE
//   node dist/bench/rollout_engines.js --shape tiny          # CPU, seconds (npm run bench)
// Flags: --shape 0.5b|tiny, --prompts, --n, --new, --prompt-len 16, --host-rows 8 (0: skip),
// --host-new 32, --gpu auto|cpu|vulkan|cuda, --weights f32[,f16] (none: the host decoder only), --kv f32|f16, --threads 0,
// --max-seqs 256, --tokenizer PATH (default the stories tok512.bin), --out FILE (JSON, rewritten after each phase).
import os from "node:os";
import { writeFileAtomic } from "../src/utils/fs.js";
import { sharedPath } from "../src/utils/paths.js";
import { initBackend } from "../src/engine/backend.js";
import { makeConfig, numParams, type ModelConfig } from "../src/models/config.js";
import { initModel } from "../src/models/init.js";
import { loadTokenizer } from "../src/models/tokenizers/index.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../src/rollout/index.js";
import { LlamaCppRolloutEngine } from "../src/rollout/llama_cpp/engine.js";
import { loadLlama, type LlamaGpuSetting } from "../src/rollout/llama_cpp/binding.js";
import type { GgufWeightType } from "../src/models/gguf.js";
import { Rng } from "../src/utils/rng.js";
import { countOnes } from "./groups.js";

const SHAPES: Record<string, (vocab: number) => ModelConfig> = {
  // Qwen2.5-0.5B's shape (issue 17's policy): 358M parameters with the 512-token stories vocabulary
  "0.5b": (v) => makeConfig({ vocabSize: v, dim: 896, hiddenDim: 4864, nLayers: 24, nHeads: 14, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: true, maxSeqLen: 2048 }),
  tiny: (v) => makeConfig({ vocabSize: v, dim: 64, hiddenDim: 128, nLayers: 2, nHeads: 4, nKvHeads: 2, attentionBias: true, tieWordEmbeddings: true, maxSeqLen: 2048 }),
};

function flags(argv: string[]): Map<string, string> {
  const m = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i]!, v = argv[i + 1];
    if (!k.startsWith("--") || v === undefined) throw new Error(`rollout_engines: flags are --name value, got '${k}'`);
    m.set(k.slice(2), v);
  }
  return m;
}

async function main(): Promise<void> {
  const f = flags(process.argv.slice(2));
  const int = (k: string, d: number) => {
    const v = Number(f.get(k) ?? d);
    if (!Number.isInteger(v) || v < 0) throw new Error(`rollout_engines: --${k} must be a non-negative integer`);
    return v;
  };
  const shape = f.get("shape") ?? "tiny";
  if (!SHAPES[shape]) throw new Error(`rollout_engines: --shape must be one of ${Object.keys(SHAPES).join(", ")}`);
  const prompts = int("prompts", shape === "tiny" ? 16 : 64), n = int("n", shape === "tiny" ? 4 : 8), R = int("new", shape === "tiny" ? 64 : 256);
  const P = int("prompt-len", 16), hostRows = int("host-rows", 8), hostNew = int("host-new", 32);
  const gpu = (f.get("gpu") ?? "auto") as LlamaGpuSetting;
  const weightTypes = (f.get("weights") ?? "f32").split(",") as GgufWeightType[];
  const kv = (f.get("kv") ?? "f32") as "f32" | "f16";
  const out = f.get("out");
  const tokPath = f.get("tokenizer") ?? sharedPath("models", "stories260K", "tok512.bin");
  const result: Record<string, unknown> = { name: "rollout_engines", shape, prompts, n, new_tokens: R, prompt_len: P, date: new Date().toISOString() };
  const save = () => { if (out) writeFileAtomic(out, JSON.stringify(result, null, 2) + "\n"); };
  if (!tokPath) {
    result.skipped = "no tokenizer: ../shared/models/stories260K/tok512.bin is absent (give --tokenizer)";
    console.log(JSON.stringify(result));
    return;
  }

  await initBackend("cpu");
  const tokenizer = await loadTokenizer(tokPath);
  const cfg = SHAPES[shape]!(tokenizer.vocabSize);
  let t0 = performance.now();
  const model = initModel(cfg, new Rng(1));
  result.params = numParams(cfg);
  result.init_s = (performance.now() - t0) / 1000;
  result.machine = { cpu: os.cpus()[0]?.model.trim(), cores: os.availableParallelism(), node: process.version };
  const rng = new Rng(7);
  const ids = Array.from({ length: prompts }, () => Array.from({ length: P }, () => 3 + 256 + rng.int(tokenizer.vocabSize - 259)));
  const batch = leftPadPrompts(ids, tokenizer.padTokenId);
  const params = defaultSamplingParams({ temperature: 1, responseLength: R, eosTokenIds: [tokenizer.eosTokenId], padTokenId: tokenizer.padTokenId, calculateLogProbs: true, n, ignoreEos: true });

  try {
    const llama = await loadLlama(gpu);
    const dev = llama as unknown as { getGpuDeviceNames?: () => Promise<string[]>; getVramState?: () => Promise<{ total: number }> };
    result.llama_cpp_build = { gpu: llama.gpu, devices: await dev.getGpuDeviceNames?.().catch(() => []) };
  } catch (e) {
    result.llama_cpp_error = (e as Error).message;
  }
  save();

  if (!result.llama_cpp_error) {
    for (const wt of weightTypes.filter((w) => w !== "none" as string)) {
      const engine = new LlamaCppRolloutEngine({ weightType: wt, kvCacheType: kv, gpu, ggufDir: "/dev/shm", threads: int("threads", 0), flashAttention: false, maxNumSeqs: int("max-seqs", 256) }, `bench-${wt}`);
      try {
        // a warm-up call of one row loads the weights (the sync) and builds the context
        await engine.generate({ model, tokenizer, prompts: batch.slice(0, 1), params: { ...params, n: 1, responseLength: 4 }, rng: new Rng(0) });
        const sync = engine.timing.syncSeconds;
        t0 = performance.now();
        const res = await engine.generate({ model, tokenizer, prompts: batch, params, rng: new Rng(1) });
        const wall = (performance.now() - t0) / 1000;
        const tokens = countOnes(res, "response_mask");
        result[`llama_cpp_${wt}`] = { sync_s: sync, generate_s: wall, tokens, tokens_per_s: tokens / wall, sequences: prompts * n, kv_cache: kv };
      } catch (e) {
        result[`llama_cpp_${wt}`] = { error: (e as Error).message };
      } finally {
        await engine.dispose();
      }
      save();
    }
  }

  if (hostRows > 0) {
    const rows = Math.min(hostRows, prompts);
    // the first call prepares the decoder's copy of the weights (minutes at 0.5B on a small CPU): apart
    t0 = performance.now();
    generate(model, batch.slice(0, 1), { ...params, n: 1, responseLength: 1 }, new Rng(3));
    const prepare = (performance.now() - t0) / 1000;
    t0 = performance.now();
    const res = generate(model, batch.slice(0, rows), { ...params, n: 1, responseLength: hostNew }, new Rng(2));
    const wall = (performance.now() - t0) / 1000;
    const tokens = countOnes(res, "response_mask");
    result.host = { rows, new_tokens: hostNew, prepare_s: prepare, generate_s: wall, tokens, tokens_per_s: tokens / wall };
    save();
  }
  model.dispose();
  console.log(JSON.stringify(result));
}

main().then(() => process.exit(0), (e) => {
  console.log(JSON.stringify({ name: "rollout_engines", error: (e as Error).stack ?? String(e) }));
  process.exit(1);
});
