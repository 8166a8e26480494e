// VERL_PROFILE_GPU_CALLS=1: a diagnostic for where the host's time per dispatch goes. A V8 CPU profile
// (node --cpu-prof) charges the time of a native call into Dawn to the JS function that made it, so
// tfjs's recordAndSubmit shows as one block; with this on, each Dawn call tfjs makes per dispatch
// goes through a JS function named after it (gpu_Device_createBindGroup, gpu_Queue_writeBuffer, ...),
// and the profile splits the block by call kind. Off by default: the extra frame costs a little.

/** The Dawn calls of a recorded dispatch, a submit and a buffer's life, by class. */
const CALLS: Record<string, string[]> = {
  GPUDevice: ["createBindGroup", "createBuffer", "createCommandEncoder", "createComputePipeline"],
  GPUQueue: ["writeBuffer", "submit", "onSubmittedWorkDone"],
  GPUCommandEncoder: ["beginComputePass", "finish", "copyBufferToBuffer"],
  GPUComputePassEncoder: ["setPipeline", "setBindGroup", "dispatchWorkgroups", "end"],
  GPUComputePipeline: ["getBindGroupLayout"],
  GPUBuffer: ["destroy", "mapAsync", "getMappedRange", "unmap"],
};

/** Wraps the calls above on the classes of `globals` (the webgpu package's); returns how many were wrapped. */
export function nameGpuCalls(globals: Record<string, unknown>): number {
  let n = 0;
  for (const [cls, methods] of Object.entries(CALLS)) {
    const proto = (globals[cls] as { prototype?: Record<string, unknown> } | undefined)?.prototype;
    if (!proto) continue;
    for (const m of methods) {
      const orig = proto[m];
      if (typeof orig !== "function") continue;
      const name = `gpu_${cls.slice(3)}_${m}`;
      // a named function expression: profiles take the name from the function itself (a computed
      // method key is shown as "proto.<computed>"), and one function a call kind keeps them apart
      proto[m] = new Function("orig", `return function ${name}(...args) { return orig.apply(this, args); };`)(orig);
      n++;
    }
  }
  return n;
}
