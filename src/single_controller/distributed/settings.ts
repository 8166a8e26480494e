// The timeouts of a run spanning hosts, from the config: trainer.collective_timeout
// (seconds a collective may wait for a peer host), else verl's
// actor_rollout_ref.nccl_timeout (the same meaning for NCCL), else the pool's 120 s;
// trainer.keepalive_s (the control link's keepalive ping interval and timeout, so a
// host that vanished shows after about twice this; default 10 s).
export interface ClusterTimeouts {
  collectiveTimeoutMs?: number;
  keepaliveMs?: number;
}

function seconds(v: unknown, key: string): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !(v > 0) || !Number.isFinite(v)) throw new Error(`${key} must be a positive number of seconds, got ${JSON.stringify(v)}`);
  return v * 1000;
}

export function clusterTimeoutsFromConfig(config: unknown): ClusterTimeouts {
  const c = (config ?? {}) as { trainer?: Record<string, unknown>; actor_rollout_ref?: Record<string, unknown> };
  const collective = seconds(c.trainer?.collective_timeout, "trainer.collective_timeout") ?? seconds(c.actor_rollout_ref?.nccl_timeout, "actor_rollout_ref.nccl_timeout");
  const keepalive = seconds(c.trainer?.keepalive_s, "trainer.keepalive_s");
  return { ...(collective !== undefined ? { collectiveTimeoutMs: collective } : {}), ...(keepalive !== undefined ? { keepaliveMs: keepalive } : {}) };
}
