export { AdamW, type AdamWOptions, type AdamWState } from "./adamw.js";
export { FlatGradAccumulator, globalNorm, clipByGlobalNorm } from "./grad_utils.js";
export { LrScheduler, type LrSchedulerState } from "./lr_scheduler.js";
