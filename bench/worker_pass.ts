// A benchmark of one worker method over a fixed batch of finished rollouts
// (B sequences of P prompt + R response tokens) on WorkerGroups of 1 and 2 ranks:
// the log-prob pass and the actor update share it.
import type { DataProto } from "../src/protocol/index.js";
import {
  emit, intFlag, loadAvg1m, machine, parseBenchArgs, rankList, rateFigures, repeat, addScaling, STORIES_ABSENT, storiesConfig, storiesPath,
  type BenchArgs,
} from "./common.js";
import { rolloutBatch, withActorGroup, type ActorGroup } from "./groups.js";

export interface WorkerPassSpec {
  name: string;
  /** The remote method timed (computeLogProb, updateActor). */
  method: string;
  /** What the config says beyond the sizes (keys of the method's section). */
  overrides(args: BenchArgs, world: number, batch: number): string[];
  /** Adds what the method needs to the batch (e.g. old_log_probs), untimed. */
  prepare?(g: ActorGroup, batch: DataProto): Promise<DataProto>;
  describe(args: BenchArgs): Record<string, unknown>;
}

export async function runWorkerPass(spec: WorkerPassSpec): Promise<void> {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 5 });
  const bin = storiesPath();
  if (!bin) return emit({ name: spec.name, skipped: STORIES_ABSENT });
  const load0 = loadAvg1m();
  const B = intFlag(args, "batch", 64), T = intFlag(args, "seq", 256), R = intFlag(args, "response", 192);
  if (R >= T) throw new Error(`benchmark: --response ${R} must be shorter than --seq ${T}`);
  const ranks = rankList(args.extra.get("ranks"));
  const data = rolloutBatch(B, T - R, R, 512, 7);
  const figures: Record<string, unknown> = {};
  let backend = "?";
  for (const world of ranks) {
    if (B % world) throw new Error(`benchmark: --batch ${B} must divide over ${world} ranks`);
    const config = storiesConfig(bin, world, [
      `data.train_batch_size=${B}`, `data.max_prompt_length=${T - R}`, `data.max_response_length=${R}`,
      `actor_rollout_ref.actor.ppo_mini_batch_size=${B}`, ...spec.overrides(args, world, B),
    ]);
    figures[`ranks_${world}`] = await withActorGroup(config, "actor_rollout", async (g) => {
      backend = g.backend;
      const batch = spec.prepare ? await spec.prepare(g, data) : data;
      const reps = await repeat(args, async () => {
        await g.proto(spec.method, batch);
        return B * T;
      });
      return rateFigures(reps, "tokens");
    });
  }
  addScaling(figures, "tokens");
  emit({
    name: spec.name,
    config: {
      model: "stories260K", sequences: B, seq_len: T, response_len: R, ranks,
      path: `WorkerGroup(ActorRolloutRefWorker).${spec.method}`, ...spec.describe(args), reps: args.reps, warmup: args.warmup,
    },
    figures,
    machine: machine(backend, load0),
  });
}
