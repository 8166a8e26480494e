// The workers of a PPO run: one resource pool of trainer.n_gpus_per_node rank
// threads, with the actor/rollout/reference role, the critic and the reward model
// colocated in the same threads (verl's hybrid engine with
// create_colocated_worker_cls), each initialised in verl's order.
import type { Config, PpoBatchPlan } from "../../config/index.js";
import { generativeRewardModel } from "../../config/validate.js";
import type { DataProto } from "../../protocol/index.js";
import {
  ClassWithInitArgs, createColocatedWorkerClass, ResourcePool, WorkerGroup, type DataProtoFuture,
} from "../../single_controller/index.js";
import { logger } from "../../utils/logger.js";

const WORKERS = new URL("../../workers/index.js", import.meta.url);

/** The remote methods the fit loop calls (results are futures; await them). */
export interface RoleGroup {
  call<R = unknown>(method: string, ...args: unknown[]): DataProtoFuture<R>;
}

export interface PpoWorkers {
  pool: ResourcePool;
  actorRollout: RoleGroup;
  critic?: RoleGroup;
  rewardModel?: RoleGroup;
  worldSize: number;
  shutdown(): Promise<void>;
}

/** Creates the pool and the role groups and runs initModel on each (critic first, as verl). */
export async function initWorkers(config: Config, plan: PpoBatchPlan): Promise<PpoWorkers> {
  const pool = await ResourcePool.launch(config, { name: "global_pool" });
  try {
    const actorRole = plan.needReference ? "actor_rollout_ref" : "actor_rollout";
    const roles: Record<string, ClassWithInitArgs> = {
      actor_rollout: new ClassWithInitArgs(WORKERS, "ActorRolloutRefWorker", config, actorRole),
    };
    if (plan.needCritic) roles.critic = new ClassWithInitArgs(WORKERS, "CriticWorker", config);
    // a generative reward model is served by the driver (reward/reward_model_server.ts), not scored by a worker
    const rmEnabled = (config.reward_model as Record<string, unknown> | undefined)?.enable === true && generativeRewardModel(config) === null;
    if (rmEnabled) roles.rm = new ClassWithInitArgs(WORKERS, "RewardModelWorker", config);
    const group = await WorkerGroup.create(pool, createColocatedWorkerClass(roles));
    const spawned = group.spawn(Object.keys(roles)) as Record<string, RoleGroup>;
    const out: PpoWorkers = {
      pool,
      actorRollout: spawned.actor_rollout!,
      worldSize: pool.worldSize,
      shutdown: () => pool.destroy(),
    };
    if (spawned.critic) {
      out.critic = spawned.critic;
      const info = await out.critic.call<{ backend: string; numParams: number }[]>("initModel");
      logger().info({ params: info[0]?.numParams, backend: info[0]?.backend }, "critic ready");
    }
    if (spawned.rm) {
      out.rewardModel = spawned.rm;
      await out.rewardModel.call("initModel");
    }
    const info = await out.actorRollout.call<{ backend: string; numParams: number }[]>("initModel");
    logger().info({ role: actorRole, ranks: pool.worldSize, params: info[0]?.numParams, backend: info[0]?.backend }, "actor ready");
    return out;
  } catch (e) {
    await pool.destroy();
    throw e;
  }
}

/** Await a worker call that returns a DataProto. */
export async function callProto(group: RoleGroup, method: string, data: DataProto): Promise<DataProto> {
  return (await group.call<DataProto>(method, data)) as DataProto;
}
