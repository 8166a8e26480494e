// Placeholder until the layer that implements `verl generate` replaces this file.
import { notBuilt, type CommandContext } from "../context.js";

export async function run(_ctx: CommandContext): Promise<void> {
  throw notBuilt("generate", "the offline generation issue");
}
