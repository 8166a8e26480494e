// `verl train [overrides...]`: PPO-family RL training (see docs/training.md).
import type { CommandContext } from "../context.js";
import { runPpo } from "../../trainer/main_ppo.js";

export async function run(ctx: CommandContext): Promise<void> {
  await runPpo(ctx.config);
}
