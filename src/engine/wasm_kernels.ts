// Kernels the wasm backend lacks. Filled in by the engine work (UnsortedSegmentSum).
export function registerWasmKernels(): void {}
