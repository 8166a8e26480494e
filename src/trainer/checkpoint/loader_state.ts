// The train dataloader's position in a step folder (data.json), as verl keeps it beside the
// model checkpoints. A damaged or mismatched file fails the resume naming the file.
import { existsSync } from "node:fs";
import { join } from "node:path";
import type { DataLoaderState } from "../../data/index.js";
import { readCheckpointJson } from "../../utils/fs.js";
import { logger } from "../../utils/logger.js";

export function restoreLoaderState(loader: { loadStateDict(s: DataLoaderState): void }, stepDir: string): void {
  const path = join(stepDir, "data.json");
  if (!existsSync(path)) {
    logger().warn({ dir: stepDir }, "checkpoint has no data.json: the dataloader starts from the beginning");
    return;
  }
  const state = readCheckpointJson<DataLoaderState>(path);
  try {
    loader.loadStateDict(state);
  } catch (e) {
    throw new Error(`checkpoint: ${path}: ${(e as Error).message}`);
  }
}
