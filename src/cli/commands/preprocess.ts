// `verl preprocess <dataset>`: turn a raw data set into verl's parquet layout through
// the data layer's preprocessor registry (gsm8k, arithmetic, ...).
import { CliError, type CommandContext } from "../context.js";

type PreprocessorLookup = (name: string) => (opts: Record<string, unknown>) => unknown;

// A path held in a variable so this file compiles before the data layer exists.
const PREPROCESS_MODULE = "../../data/preprocess/index.js";

async function loadRegistry(): Promise<PreprocessorLookup> {
  let mod: unknown;
  try {
    mod = await import(PREPROCESS_MODULE);
  } catch (e) {
    const err = e as { code?: string; message?: string };
    if (err.code === "ERR_MODULE_NOT_FOUND" && String(err.message).includes("preprocess")) {
      throw new CliError("`verl preprocess` needs the data layer's preprocessors (src/data/preprocess), which are not built yet");
    }
    throw e;
  }
  const get = (mod as { getPreprocessor?: unknown }).getPreprocessor;
  if (typeof get !== "function") throw new CliError("src/data/preprocess/index.js does not export getPreprocessor(name)");
  return get as PreprocessorLookup;
}

export async function run(ctx: CommandContext): Promise<void> {
  const { dataset, ...opts } = ctx.options;
  if (typeof dataset !== "string" || dataset === "") throw new CliError("verl preprocess: name a dataset, e.g. `verl preprocess gsm8k`", 2);
  const getPreprocessor = await loadRegistry();
  const preprocess = getPreprocessor(dataset);
  // The preprocessor logs each file it writes.
  await preprocess(opts);
}
