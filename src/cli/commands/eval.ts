// `verl eval`: score a generated parquet (a `responses` list per row) and print
// {"test_score/<data_source>": mean} as JSON on stdout.
import { getPath, type Config } from "../../config/index.js";
import { readParquet } from "../../data/parquet.js";
import { loadCustomRewardFunction } from "../../reward/custom.js";
import { evaluateGenerations } from "../../reward/evaluate.js";
import { defaultComputeScore } from "../../reward/scorers/registry.js";
import { logger } from "../../utils/logger.js";
import { CliError, type CommandContext } from "../context.js";

function stringKey(config: Config, key: string): string {
  const v = getPath(config, key);
  if (typeof v !== "string" || v === "") throw new CliError(`${key} must be set to a non-empty string (got ${JSON.stringify(v)})`, 2);
  return v;
}

export async function run(ctx: CommandContext): Promise<void> {
  const { config } = ctx;
  const path = stringKey(config, "data.path");
  const cols = {
    responseKey: stringKey(config, "data.response_key"),
    dataSourceKey: stringKey(config, "data.data_source_key"),
    rewardModelKey: stringKey(config, "data.reward_model_key"),
  };
  const custom = await loadCustomRewardFunction(config);
  const rows = await readParquet(path);
  logger().info({ path, rows: rows.length, reward_function: custom ? `${custom.source.path}:${custom.source.name}` : "built-in scorers" }, "evaluating");
  let metrics: Record<string, number>;
  try {
    metrics = await evaluateGenerations(rows, cols, custom?.computeScore ?? defaultComputeScore);
  } catch (e) {
    throw new CliError(`${path}: ${(e as Error).message}`);
  }
  process.stdout.write(JSON.stringify(metrics) + "\n");
}
