// Actor update throughput: one PPO mini-batch of 64 sequences of 256 tokens (64
// prompt + 192 response) through ActorRolloutRefWorker.updateActor: forward,
// backward, gradient all-reduce across ranks, grad clipping and one AdamW step
// (DataParallelPPOActor.updatePolicy), vanilla clipped policy loss, token-mean,
// no KL or entropy term; 1 and 2 ranks. Figure: sequence tokens per second.
// bench/pytorch_actor_update.py is the same step in PyTorch, for the comparison.
// Run: node dist/bench/actor_update.js [--reps 5] [--batch 64] [--seq 256] [--response 192] [--micro 32] [--ranks 1,2]
import { intFlag, runMain } from "./common.js";
import { runWorkerPass } from "./worker_pass.js";

runMain("actor_update", () => runWorkerPass({
  name: "actor_update",
  method: "updateActor",
  overrides: (args, world, batch) => {
    const micro = Math.min(intFlag(args, "micro", 32), batch / world);
    return [
      `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${micro}`, `actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${micro}`,
      "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.optim.weight_decay=0.01", "actor_rollout_ref.actor.grad_clip=1.0",
    ];
  },
  // The trainer hands updateActor a batch carrying old_log_probs.
  prepare: async (g, batch) => batch.union((await g.proto("computeLogProb", batch)).select(["old_log_probs"])),
  describe: (args) => ({
    micro_batch_per_rank_max: intFlag(args, "micro", 32), optimizer: "AdamW(lr=1e-5, betas=0.9/0.999, weight_decay=0.01)",
    grad_clip: 1.0, loss: "vanilla clipped PPO, token-mean", ppo_epochs: 1,
  }),
}));
