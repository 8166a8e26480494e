// WebGPU through Dawn (the `webgpu` npm package). navigator.gpu must exist before
// @tensorflow/tfjs-backend-webgpu is evaluated, or the backend never registers.
//
// VERL_WEBGPU_FEATURE_LEVEL=compatibility asks Dawn for a compatibility-mode adapter: with
// VERL_DAWN_FLAGS=backend=opengl and Mesa's llvmpipe (EGL, surfaceless) that gives a software
// WebGPU adapter on a machine without a GPU, slow but real, which runs the WebGPU kernels'
// tests there (lavapipe's Vulkan is rejected by Dawn). docs/gpu.md says how.
/**
 * The WebGPU packages install on request, not with `npm ci` (Dawn's prebuilts for five platforms are
 * 132 MB, tfjs's WebGPU backend 19 MB); scripts/gpu-bundle.sh runs this command when they are absent.
 */
export const WEBGPU_INSTALL = "npm install --no-save webgpu@0.6.2 @tensorflow/tfjs-backend-webgpu@4.22.0";

export async function prepareWebGpu(): Promise<void> {
  let mod: { create: (flags: string[]) => unknown; globals?: Record<string, unknown> };
  try {
    mod = (await import("webgpu" as string)) as typeof mod;
  } catch (e) {
    const missing = (e as { code?: string }).code === "ERR_MODULE_NOT_FOUND";
    throw new Error(missing
      ? `trainer.device=webgpu needs the 'webgpu' package (Dawn), installed on request: ${WEBGPU_INSTALL} (or trainer.device=auto for the CPU)`
      : `trainer.device=webgpu: the 'webgpu' package (Dawn) failed to load: ${(e as Error).message}`);
  }
  const flags = (process.env.VERL_DAWN_FLAGS ?? "enable-dawn-features=skip_validation").split(",").filter(Boolean);
  if (mod.globals) Object.assign(globalThis, mod.globals);
  const gpu = mod.create(flags) as GpuLike;
  if (process.env.VERL_WEBGPU_FEATURE_LEVEL) compatibilityAdapters(gpu, process.env.VERL_WEBGPU_FEATURE_LEVEL);
  const nav = (globalThis as { navigator?: object }).navigator ?? {};
  Object.defineProperty(globalThis, "navigator", { value: nav, configurable: true, writable: true });
  Object.defineProperty(nav, "gpu", { value: gpu, configurable: true });
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error("trainer.device=webgpu: no GPU adapter found (Dawn needs a GPU with a Vulkan driver); use trainer.device=auto to train on the CPU (wasm), or see docs/gpu.md for a software adapter");
  try {
    await import("@tensorflow/tfjs-backend-webgpu" as string);
  } catch (e) {
    throw new Error(`trainer.device=webgpu needs @tensorflow/tfjs-backend-webgpu, installed on request: ${WEBGPU_INSTALL} (${(e as Error).message})`);
  }
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
