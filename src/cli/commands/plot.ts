// Placeholder until the layer that implements `verl plot` replaces this file.
import { notBuilt, type CommandContext } from "../context.js";

export async function run(_ctx: CommandContext): Promise<void> {
  throw notBuilt("plot", "the metrics plotting issue");
}
