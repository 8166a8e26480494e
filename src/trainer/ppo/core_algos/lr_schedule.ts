// Learning-rate multipliers as pure functions of the scheduler step (the number of
// optimizer steps already taken, as torch's LambdaLR counts: the first update uses
// step 0). verl's `optim.lr_scheduler_type` constant | cosine.

export interface CosineScheduleOptions {
  numWarmupSteps: number;
  numTrainingSteps: number;
  minLrRatio?: number;
  numCycles?: number;
  initLrRatio?: number;
}

/** min(1, step/warmup): linear warmup from 0, then constant. */
export function constantScheduleWithWarmup(numWarmupSteps: number): (step: number) => number {
  return (step) => (step < numWarmupSteps ? step / Math.max(1, numWarmupSteps) : 1);
}

/** Linear warmup, then max(min_lr_ratio, cos(π·cycles·2·p)·(1−m)/2 + (1+m)/2), p = progress after warmup. */
export function cosineScheduleWithWarmup(opts: CosineScheduleOptions): (step: number) => number {
  const minLr = opts.minLrRatio ?? 0, cycles = opts.numCycles ?? 0.5, init = opts.initLrRatio ?? 0;
  if (!(minLr >= 0 && minLr <= 1)) throw new Error(`optim.min_lr_ratio must lie in [0, 1], got ${minLr}`);
  if (!(init >= 0 && init <= 1)) throw new Error(`init_lr_ratio must lie in [0, 1], got ${init}`);
  const coef = (1 - minLr) * 0.5, intercept = (1 + minLr) * 0.5;
  const { numWarmupSteps: warm, numTrainingSteps: total } = opts;
  return (step) => {
    if (step < warm) return init + (1 - init) * (step / Math.max(1, warm));
    const progress = (step - warm) / Math.max(1, total - warm);
    return Math.max(minLr, Math.cos(Math.PI * cycles * 2 * progress) * coef + intercept);
  };
}

/** The `optim` section keys read here (verl names). */
export interface OptimScheduleConfig {
  lr?: number;
  lr_scheduler_type?: string;
  /** deprecated alias of lr_scheduler_type */
  warmup_style?: string | null;
  lr_warmup_steps?: number | null;
  lr_warmup_steps_ratio?: number;
  total_training_steps?: number;
  min_lr_ratio?: number | null;
  num_cycles?: number;
}

export interface LrSchedule {
  numWarmupSteps: number;
  /** Multiplier of optim.lr at a scheduler step. */
  ratio(step: number): number;
  /** optim.lr × ratio(step). */
  lr(step: number): number;
}

/**
 * Build the schedule from an optim config. Warmup steps = lr_warmup_steps when it is
 * ≥ 0, else ⌊lr_warmup_steps_ratio × total⌋; `totalTrainingSteps` overrides
 * optim.total_training_steps (the trainer injects it at runtime, as verl does).
 */
export function getLrSchedule(optim: OptimScheduleConfig, totalTrainingSteps?: number): LrSchedule {
  const total = totalTrainingSteps ?? optim.total_training_steps ?? 0;
  const type = optim.warmup_style ?? optim.lr_scheduler_type ?? "constant";
  const explicit = optim.lr_warmup_steps ?? -1;
  const numWarmupSteps = explicit >= 0 ? Math.trunc(explicit) : Math.trunc((optim.lr_warmup_steps_ratio ?? 0) * total);
  let ratio: (step: number) => number;
  if (type === "constant") ratio = constantScheduleWithWarmup(numWarmupSteps);
  else if (type === "cosine") {
    ratio = cosineScheduleWithWarmup({ numWarmupSteps, numTrainingSteps: total, minLrRatio: optim.min_lr_ratio ?? 0, numCycles: optim.num_cycles ?? 0.5 });
  } else throw new Error(`optim.lr_scheduler_type '${type}' is not supported; choose constant or cosine`);
  const base = optim.lr ?? 1e-6;
  return { numWarmupSteps, ratio, lr: (step) => base * ratio(step) };
}
