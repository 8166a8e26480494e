// `verl preprocess <dataset>`: turn a raw data set into verl's parquet layout through
// the data layer's preprocessor registry (gsm8k, arithmetic, ...).
import { logger } from "../../utils/logger.js";
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

/** The one value several spellings of a flag give, or undefined; different values are an error naming them. */
function oneOf(opts: Record<string, unknown>, spellings: [flag: string, key: string][], what: string): string | undefined {
  const given = spellings.filter(([, k]) => opts[k] !== undefined).map(([f, k]) => [f, String(opts[k])] as const);
  if (new Set(given.map(([, v]) => v)).size > 1) {
    throw new CliError(`verl preprocess: ${given.map(([f, v]) => `${f} ${v}`).join(" and ")} each name ${what}; give one`, 2);
  }
  return given[0]?.[1];
}

/**
 * verl's flags with verl's meanings: --local_dataset_path is the raw input, --local_save_dir the
 * output, --local_dir verl's deprecated name of the output. verl-ts once read the input from
 * --local-dir; that spelling now means what verl means by it, the output.
 */
export function resolvePreprocessFlags(opts: Record<string, unknown>): Record<string, unknown> {
  const {
    local_dataset_path, localDatasetPath, local_save_dir, localSaveDir, local_dir, localDir, outputDir, hdfs_dir, ...rest
  } = opts;
  if (hdfs_dir !== undefined) throw new CliError("verl preprocess: --hdfs_dir is not available in verl-ts (no HDFS client); copy the --local_save_dir folder yourself", 2);
  const input = oneOf({ local_dataset_path, localDatasetPath }, [["--local_dataset_path", "local_dataset_path"], ["--local-dataset-path", "localDatasetPath"]], "the raw data set");
  const output = oneOf(
    { local_save_dir, localSaveDir, local_dir, localDir, outputDir },
    [["--local_save_dir", "local_save_dir"], ["--local-save-dir", "localSaveDir"], ["--local_dir", "local_dir"], ["--local-dir", "localDir"], ["--output-dir", "outputDir"]],
    "the output directory (--local_dir/--local-dir is verl's deprecated name of --local_save_dir; the raw data set is --local_dataset_path)",
  );
  if (local_dir !== undefined || localDir !== undefined) {
    logger().warn(
      "--local_dir is deprecated (as in verl): use --local_save_dir. It names the directory the parquet files are written to, " +
        "as in verl; the raw data set is --local_dataset_path",
    );
  }
  return { ...rest, ...(input !== undefined ? { localDatasetPath: input } : {}), ...(output !== undefined ? { localSaveDir: output } : {}) };
}

export async function run(ctx: CommandContext): Promise<void> {
  const { dataset, ...flags } = ctx.options;
  if (typeof dataset !== "string" || dataset === "") throw new CliError("verl preprocess: name a dataset, e.g. `verl preprocess gsm8k`", 2);
  const opts = resolvePreprocessFlags(flags);
  const getPreprocessor = await loadRegistry();
  const preprocess = getPreprocessor(dataset);
  // The preprocessor logs each file it writes.
  await preprocess(opts);
}
