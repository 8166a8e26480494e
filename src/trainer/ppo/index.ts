// Public surface of the PPO trainer: `verl train` as a function, the fit loop,
// worker setup, checkpoints and experiment tracking.
export { runPpo, totalTrainingSteps } from "../main_ppo.js";
export { PPOTrainer, type FitResult, type PpoTrainerDeps, type TrainLoader } from "./ppo_trainer.js";
export { initWorkers, type PpoWorkers, type RoleGroup } from "./resources.js";
export { validate as validatePpo, dumpGenerations, type ValidationContext } from "./validation.js";
export { saveTrainerCheckpoint, loadTrainerCheckpoint, checkpointManagerFor, type DriverState, type ResumedRun } from "./trainer_checkpoint.js";
export { timed as timedStage, type TimingRaw } from "./timer.js";
export { CheckpointManager, stepFromPath, TRACKER_FILE, type ResumeMode, type ResumePoint, type RetentionLimits } from "../checkpoint/checkpoint_manager.js";
export {
  Tracking, registerTrackingBackend, knownTrackingBackends, loggerList, fileLoggerPath, formatConsoleLine,
  type TrackingBackend, type TrackingBackendFactory, type TrackingOptions,
} from "../../utils/tracking.js";
