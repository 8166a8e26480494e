// Rollout throughput on the production path: 64 story prompts, 128 new tokens each
// (EOS ignored, so every row generates the full length), sampling at temperature 1,
// through ActorRolloutRefWorker.generateSequences on a WorkerGroup of 1 and of 2
// rank threads (the batch is split over the ranks by DP_COMPUTE_PROTO, as in
// `verl train`). Figure: generated tokens per second of wall time.
// Run: node dist/bench/rollout.js [--reps 5] [--warmup 1] [--prompts 64] [--tokens 128] [--ranks 1,2]
import { leftPadPrompts } from "../src/rollout/index.js";
import { ConfigView } from "../src/workers/index.js";
import { loadModelTokenizer } from "../src/workers/model_source.js";
import {
  emit, intFlag, OPENINGS, loadAvg1m, machine, parseBenchArgs, rankList, rateFigures, repeat, addScaling, runMain, STORIES_ABSENT, storiesConfig, storiesPath,
} from "./common.js";
import { countOnes, withActorGroup } from "./groups.js";

const NAME = "rollout";


async function main(): Promise<void> {
  const args = parseBenchArgs();
  const bin = storiesPath();
  if (!bin) return emit({ name: NAME, skipped: STORIES_ABSENT });
  const load0 = loadAvg1m();
  const nPrompts = intFlag(args, "prompts", 64), newTokens = intFlag(args, "tokens", 128);
  const ranks = rankList(args.extra.get("ranks"));
  const overrides = (world: number, promptLen: number) => [
    `data.train_batch_size=${nPrompts}`, `data.max_prompt_length=${promptLen}`, `data.max_response_length=${newTokens}`,
    "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.ignore_eos=True",
    `actor_rollout_ref.actor.ppo_mini_batch_size=${nPrompts}`, `actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${nPrompts / world}`,
    `actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${nPrompts / world}`,
  ];
  const tokenizer = await loadModelTokenizer(new ConfigView(storiesConfig(bin, 1, overrides(1, 16))).at("actor_rollout_ref.model"));
  const promptIds = Array.from({ length: nPrompts }, (_, i) => tokenizer.encode(OPENINGS[i % OPENINGS.length]!));
  const promptLen = Math.max(...promptIds.map((p) => p.length));
  const prompts = leftPadPrompts(promptIds, tokenizer.padTokenId);

  const figures: Record<string, unknown> = {};
  let backend = "?";
  for (const world of ranks) {
    if (nPrompts % world) throw new Error(`benchmark: --prompts ${nPrompts} must divide over ${world} ranks`);
    figures[`ranks_${world}`] = await withActorGroup(storiesConfig(bin, world, overrides(world, promptLen)), "actor_rollout", async (g) => {
      backend = g.backend;
      const reps = await repeat(args, async () => countOnes(await g.proto("generateSequences", prompts), "response_mask"));
      return rateFigures(reps, "generated_tokens");
    });
  }
  addScaling(figures, "generated_tokens");
  emit({
    name: NAME,
    config: {
      model: "stories260K", prompts: nPrompts, new_tokens: newTokens, prompt_tokens_max: promptLen, temperature: 1, ignore_eos: true,
      ranks, path: "WorkerGroup(ActorRolloutRefWorker).generateSequences", reps: args.reps, warmup: args.warmup,
    },
    figures,
    machine: machine(backend, load0),
  });
}

runMain(NAME, main);
