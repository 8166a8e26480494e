// WebGPU through Dawn (the `webgpu` npm package). navigator.gpu must exist before
// @tensorflow/tfjs-backend-webgpu is evaluated, or the backend never registers.
export async function prepareWebGpu(): Promise<void> {
  let mod: { create: (flags: string[]) => unknown; globals?: Record<string, unknown> };
  try {
    mod = (await import("webgpu" as string)) as typeof mod;
  } catch (e) {
    throw new Error(`engine backend 'webgpu' needs the optional 'webgpu' package (Dawn): ${(e as Error).message}`);
  }
  const flags = (process.env.VERL_DAWN_FLAGS ?? "enable-dawn-features=skip_validation").split(",").filter(Boolean);
  if (mod.globals) Object.assign(globalThis, mod.globals);
  const gpu = mod.create(flags);
  const nav = (globalThis as { navigator?: object }).navigator ?? {};
  Object.defineProperty(globalThis, "navigator", { value: nav, configurable: true, writable: true });
  Object.defineProperty(nav, "gpu", { value: gpu, configurable: true });
  const adapter = await (gpu as { requestAdapter(): Promise<unknown> }).requestAdapter();
  if (!adapter) throw new Error("engine backend 'webgpu': no GPU adapter found (Dawn needs a Vulkan driver)");
  await import("@tensorflow/tfjs-backend-webgpu");
}
