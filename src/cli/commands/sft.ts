// `verl sft key=value ...`: supervised fine-tuning (config sft_trainer.yaml).
import { runSft } from "../../trainer/sft/index.js";
import type { CommandContext } from "../context.js";

export async function run(ctx: CommandContext): Promise<void> {
  const r = await runSft(ctx.config);
  const parts = [`step ${r.globalStep}/${r.totalSteps}`];
  if (r.trainLoss !== undefined) parts.push(`train/loss ${r.trainLoss.toFixed(4)}`);
  if (r.valLoss !== undefined) parts.push(`val/loss ${r.valLoss.toFixed(4)}`);
  process.stdout.write(`SFT finished: ${parts.join(", ")}\nfinal model (Hugging Face folder): ${r.hfDir}\n`);
}
