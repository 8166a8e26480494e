// Public surface of the engine layer: backend selection and the fast-path matmuls.
export { initBackend, currentBackend, resolveBackendName, backendImporters, BACKEND_NAMES, type BackendName } from "./backend.js";
export { linear, matmul } from "./matmul.js";
export { registerWasmKernels } from "./wasm_kernels.js";
export { hostKernels, JsKernels, XnnpackKernels, transposeToInOut, type HostKernels, type HostBuffer, type HostWeight } from "./host_kernels.js";
export { fusedGroupedAttention, fusedAttentionAvailable, type FusedAttentionShape } from "./fused_attention.js";
export { simdSupported } from "./simd/asm.js";
