// Public surface of the rollout layer: generation and log-probs.
export { generate, type GenerateOptions } from "./generate.js";
export { TokenSampler, defaultSamplingParams, checkSamplingParams, isGreedy, type SamplingParams } from "./sampling.js";
export { KvCacheDecoder, FullForwardDecoder, type StepDecoder, type SlotDecoder, type SlotDecoderFactory } from "./decoder.js";
export { KvCache } from "./kv_cache.js";
export { readParamsForDecode } from "./decode_weights.js";
export { logProbsFromLogits, entropyFromLogits, responseLogProbs, computeLogProb, type LogProbOptions, type ComputeLogProbOptions } from "./log_probs.js";
export { leftPadPrompts } from "./prompts.js";
export { assembleRollout, promptRows, type GeneratedRows } from "./generate.js";
export * from "./engines/index.js";
