// Placeholder until the layer that implements `verl sft` replaces this file.
import { notBuilt, type CommandContext } from "../context.js";

export async function run(_ctx: CommandContext): Promise<void> {
  throw notBuilt("sft", "the SFT trainer issue");
}
