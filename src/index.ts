// The public API of verl-ts: each layer's index, re-exported from the package root
// (`import { DataProto, registerAdvEstimator, loadConfig } from "verl-ts"`).
export * from "./engine/index.js";
export * from "./engine/optim/index.js";
export * from "./utils/rng.js";
export { sharedPath, sharedDir, packageRoot } from "./utils/paths.js";
export * from "./protocol/index.js";
export * from "./config/index.js";
export * from "./data/index.js";
export * from "./data/preprocess/index.js";
export * from "./models/index.js";
export * from "./models/tokenizers/index.js";
export * from "./rollout/index.js";
export * from "./single_controller/index.js";
export * from "./trainer/ppo/core_algos/index.js";
export * from "./reward/index.js";
export * from "./workers/index.js";
export * from "./trainer/ppo/index.js";
export * from "./agent_loop/index.js";
export * from "./tools/index.js";
export * from "./interactions/index.js";
