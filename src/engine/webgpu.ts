// WebGPU through Dawn (the `webgpu` npm package). navigator.gpu must exist before
// @tensorflow/tfjs-backend-webgpu is evaluated, or the backend never registers.
//
// VERL_WEBGPU_FEATURE_LEVEL=compatibility asks Dawn for a compatibility-mode adapter: with
// VERL_DAWN_FLAGS=backend=opengl and Mesa's llvmpipe (EGL, surfaceless) that gives a software
// WebGPU adapter on a machine without a GPU, slow but real, which runs the WebGPU kernels'
// tests there (lavapipe's Vulkan is rejected by Dawn). docs/gpu.md says how.
export async function prepareWebGpu(): Promise<void> {
  let mod: { create: (flags: string[]) => unknown; globals?: Record<string, unknown> };
  try {
    mod = (await import("webgpu" as string)) as typeof mod;
  } catch (e) {
    throw new Error(`engine backend 'webgpu' needs the optional 'webgpu' package (Dawn): ${(e as Error).message}`);
  }
  const flags = (process.env.VERL_DAWN_FLAGS ?? "enable-dawn-features=skip_validation").split(",").filter(Boolean);
  if (mod.globals) Object.assign(globalThis, mod.globals);
  const gpu = mod.create(flags) as GpuLike;
  if (process.env.VERL_WEBGPU_FEATURE_LEVEL) compatibilityAdapters(gpu, process.env.VERL_WEBGPU_FEATURE_LEVEL);
  const nav = (globalThis as { navigator?: object }).navigator ?? {};
  Object.defineProperty(globalThis, "navigator", { value: nav, configurable: true, writable: true });
  Object.defineProperty(nav, "gpu", { value: gpu, configurable: true });
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error("engine backend 'webgpu': no GPU adapter found (Dawn needs a Vulkan driver)");
  await import("@tensorflow/tfjs-backend-webgpu");
}

interface AdapterLike {
  limits: Record<string, number>;
  requestDevice(d?: { requiredLimits?: Record<string, number> }): Promise<unknown>;
}
interface GpuLike { requestAdapter(o?: object): Promise<AdapterLike | null> }

/**
 * Every adapter request asks for `level` (tfjs asks for none), and every device for the
 * adapter's storage-buffer count: a compatibility device defaults to 4 per stage, fewer
 * than tfjs's and the decoder's kernels bind.
 */
function compatibilityAdapters(gpu: GpuLike, level: string): void {
  const request = gpu.requestAdapter.bind(gpu);
  gpu.requestAdapter = async (o: object = {}) => {
    const adapter = await request({ ...o, featureLevel: level });
    if (!adapter) return adapter;
    const device = adapter.requestDevice.bind(adapter);
    adapter.requestDevice = (d = {}) =>
      device({ ...d, requiredLimits: { ...(d.requiredLimits ?? {}), maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage! } });
    return adapter;
  };
}
