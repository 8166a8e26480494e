// Rollout engines: the registry, and the built-in engines (importing registers them).
export { registerRolloutEngine, createRolloutEngine, rolloutEngineNames, type RolloutEngine, type RolloutEngineFactory, type RolloutEngineContext, type RolloutRequest } from "./registry.js";
export { HostRolloutEngine, HOST_ENGINE_NAMES } from "./host.js";
export { LlamaCppRolloutEngine, llamaCppSettings, samplerOptions, LLAMA_MAX_SEQUENCES, type LlamaCppSettings } from "../llama_cpp/engine.js";
export { WebGpuRolloutEngine, BestAvailableRolloutEngine } from "./webgpu.js";
