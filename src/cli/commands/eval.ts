// Placeholder until the layer that implements `verl eval` replaces this file.
import { notBuilt, type CommandContext } from "../context.js";

export async function run(_ctx: CommandContext): Promise<void> {
  throw notBuilt("eval", "the offline evaluation issue");
}
