// Placeholder until the layer that implements `verl train` replaces this file.
import { notBuilt, type CommandContext } from "../context.js";

export async function run(_ctx: CommandContext): Promise<void> {
  throw notBuilt("train", "the PPO trainer issue");
}
