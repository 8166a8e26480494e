// Log-prob pass throughput: 64 sequences of 256 tokens (64 prompt + 192 response)
// through ActorRolloutRefWorker.computeLogProb (old_log_probs and entropy, as the
// trainer asks for them) on 1 and 2 ranks. Figure: sequence tokens per second.
// Run: node dist/bench/log_prob.js [--reps 5] [--batch 64] [--seq 256] [--response 192] [--micro 64] [--ranks 1,2]
import { intFlag, runMain } from "./common.js";
import { runWorkerPass } from "./worker_pass.js";

runMain("log_prob", () => runWorkerPass({
  name: "log_prob",
  method: "computeLogProb",
  // The recipe's micro-batch (64 rows per forward pass), capped by each rank's share.
  overrides: (args, world, batch) => {
    const micro = Math.min(intFlag(args, "micro", 64), batch / world);
    return [`actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${micro}`, `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${micro}`];
  },
  describe: (args) => ({ micro_batch_per_rank_max: intFlag(args, "micro", 64), entropy: true }),
}));
