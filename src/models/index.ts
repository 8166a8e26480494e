// Public surface of the model layer.
export { makeConfig, validateConfig, numParams, fromHfConfig, toHfConfig, SUPPORTED_ARCHITECTURES, type ModelConfig } from "./config.js";
export { LlamaModel, parameterShapes, positionsFromMask, ropeTables, contiguousKeyStart, toVariables, type ForwardOptions, type MtpInputs } from "./llama.js";
export { groupedAttention, type AttentionShape } from "./attention.js";
export { rmsNorm, swiGlu } from "./layers.js";
export { ValueHeadModel } from "./value_head.js";
export { initModel, INIT_STD } from "./init.js";
export { loadLlama2c, permuteInterleavedToHalves } from "./llama2c.js";
export type { Tokenizer, ChatMessage } from "./tokenizer.js";
export { loadHfModel, loadHfValueModel, saveHfModel, readHfWeights } from "./hf.js";
export { loadModel } from "./load.js";
export { parseSafetensors, readSafetensors, serializeSafetensors, halfToFloat, type NamedArray } from "./safetensors.js";
export { LoraAdapter, linearModules, selectTargets, validateLoraSettings, type LoraSettings, type LoraModule } from "./lora.js";
export { loraLinear, type LoraBlock } from "./lora_linear.js";
export { saveLoraAdapter, loadLoraAdapter, readAdapterSettings, ADAPTER_CONFIG, ADAPTER_WEIGHTS } from "./peft.js";
export { forEachMergedWeight, mergedHostWeights, mergedWeightSync, weightIdentity } from "./merge.js";
export { checkpoint } from "./checkpointing.js";
export { packRows, packResponses, segmentView, type PackedRows, type PackedResponses, type SegmentView } from "./packing.js";
