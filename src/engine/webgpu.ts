import { hoistDirectives, rewriteF16Bindings } from "./webgpu_gemm.js";
import { tensorCoreSupport } from "./webgpu_kernels.js";
import { setFragmentGeometry } from "./subgroup_fragments.js";
import { cacheBindGroups } from "./bind_group_cache.js";
import { insideNativeCall } from "../single_controller/heartbeat.js";

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
//
// Tensor cores (issue 23): Dawn exposes subgroup matrices and shader-f16 on NVIDIA's Vulkan
// driver only under the toggles allow_unsafe_apis (experimental features) and
// vulkan_enable_f16_on_nvidia; both are in the default flags (docs/gpu.md says why they are
// safe here). The device tfjs creates is asked for those features when the adapter has them,
// and its shader modules get their `enable` directives hoisted (webgpu_gemm.ts).
export const DEFAULT_DAWN_FLAGS = "enable-dawn-features=skip_validation,allow_unsafe_apis,vulkan_enable_f16_on_nvidia,vulkan_use_cooperative_matrix_robust_access";

/** What the adapter offered and what was asked of it, for the start-up line and benchmarks. */
export const webGpuInfo: {
  flags: string[]; features: string[]; requested: string[]; subgroupMatrixConfigs: string[];
  subgroupMinSize?: number; subgroupMaxSize?: number; adapter?: string;
  /** Dawn's name of the GPU model (adapter.info.device, e.g. "nvidia-h200"); empty on some drivers. */
  device?: string;
} = { flags: [], features: [], requested: [], subgroupMatrixConfigs: [] };

const TC_FEATURES = ["shader-f16", "chromium-experimental-subgroup-matrix", "subgroups"];

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
  const flags = splitFlags(process.env.VERL_DAWN_FLAGS ?? DEFAULT_DAWN_FLAGS);
  if (mod.globals) Object.assign(globalThis, mod.globals);
  if (process.env.VERL_PROFILE_GPU_CALLS === "1" && mod.globals) (await import("./gpu_call_names.js")).nameGpuCalls(mod.globals);
  const gpu = mod.create(flags) as GpuLike;
  if (process.env.VERL_WEBGPU_FEATURE_LEVEL) compatibilityAdapters(gpu, process.env.VERL_WEBGPU_FEATURE_LEVEL);
  tensorCoreDevices(gpu);
  webGpuInfo.flags = flags;
  const nav = (globalThis as { navigator?: object }).navigator ?? {};
  Object.defineProperty(globalThis, "navigator", { value: nav, configurable: true, writable: true });
  Object.defineProperty(nav, "gpu", { value: gpu, configurable: true });
  const adapter = await gpu.requestAdapter();
  if (!adapter) throw new Error("trainer.device=webgpu: no GPU adapter found (Dawn needs a GPU with a Vulkan driver); use trainer.device=auto to train on the CPU (wasm), or see docs/gpu.md for a software adapter");
  describeAdapter(adapter);
  try {
    await import("@tensorflow/tfjs-backend-webgpu" as string);
  } catch (e) {
    throw new Error(`trainer.device=webgpu needs @tensorflow/tfjs-backend-webgpu, installed on request: ${WEBGPU_INSTALL} (${(e as Error).message})`);
  }
  if (process.env.VERL_WEBGPU_QUIET !== "1") console.error(`[verl-ts] ${webGpuSummary()}`);
}

/**
 * Dawn's flags: `enable-dawn-features=a,b` keeps its comma-separated toggles together;
 * other entries (backend=..., adapter=...) are separated by commas too.
 */
export function splitFlags(s: string): string[] {
  const out: string[] = [];
  for (const part of s.split(",").map((x) => x.trim()).filter(Boolean)) {
    if (part.includes("=") || out.length === 0) out.push(part);
    else out[out.length - 1] += `,${part}`;
  }
  return out;
}

/** One line: the adapter, its features, the Dawn toggles, and whether the tensor-core GEMM can run. */
export function webGpuSummary(): string {
  return `webgpu adapter: ${webGpuInfo.adapter ?? "?"}; dawn flags: ${webGpuInfo.flags.join(" ") || "(none)"}; ` +
    `features: ${webGpuInfo.features.join(",")}; subgroup sizes ${webGpuInfo.subgroupMinSize ?? "?"}-${webGpuInfo.subgroupMaxSize ?? "?"}; ` +
    `subgroup-matrix configs: ${webGpuInfo.subgroupMatrixConfigs.join(" ") || "none"}; ` +
    `tensor-core GEMM: ${tensorCoreSupport.available ? `available (${tensorCoreSupport.fragments})` : `unavailable (${tensorCoreSupport.reason})`}`;
}

interface SubgroupMatrixConfig { M: number; N: number; K: number; componentType: string; resultComponentType: string }
interface AdapterInfoLike { vendor?: string; architecture?: string; device?: string; description?: string; subgroupMinSize?: number; subgroupMaxSize?: number; subgroupMatrixConfigs?: SubgroupMatrixConfig[] }

function describeAdapter(adapter: AdapterLike): void {
  const info = (adapter.info ?? {}) as AdapterInfoLike;
  webGpuInfo.adapter = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" ");
  webGpuInfo.device = info.device || undefined;
  webGpuInfo.features = [...(adapter.features ?? [])].sort();
  webGpuInfo.subgroupMinSize = info.subgroupMinSize;
  webGpuInfo.subgroupMaxSize = info.subgroupMaxSize;
  const configs = [...(info.subgroupMatrixConfigs ?? [])];
  webGpuInfo.subgroupMatrixConfigs = configs.map((c) => `${c.componentType}->${c.resultComponentType}:M${c.M}N${c.N}K${c.K}`);
  const has = (f: string) => webGpuInfo.features.includes(f);
  const side = ([16, 8] as const).find((n) => configs.some((c) => c.componentType === "f16" && c.resultComponentType === "f32" && c.M === n && c.N === n && c.K === n));
  const fixedSubgroup = info.subgroupMinSize !== undefined && info.subgroupMinSize === info.subgroupMaxSize ? info.subgroupMinSize : undefined;
  const missing = ["shader-f16", "chromium-experimental-subgroup-matrix"].filter((f) => !has(f));
  if (missing.length) Object.assign(tensorCoreSupport, { available: false, reason: `the adapter lacks ${missing.join(", ")} (Dawn toggles allow_unsafe_apis and vulkan_enable_f16_on_nvidia expose them on NVIDIA)`, fragments: "" });
  else if (!side) Object.assign(tensorCoreSupport, { available: false, reason: "no f16 x f16 -> f32 subgroup-matrix config of 16x16x16 or 8x8x8", fragments: "" });
  // the kernels place fragments by subgroup index (invocation / subgroup size): the size must be known
  else if (fixedSubgroup === undefined) Object.assign(tensorCoreSupport, { available: false, reason: `subgroup size ${info.subgroupMinSize}-${info.subgroupMaxSize} is not fixed, the kernels need to know it`, fragments: "" });
  else {
    setFragmentGeometry({ side, subgroupSize: fixedSubgroup });
    const fragments = side === 16 ? `16x16x16, subgroups of ${fixedSubgroup}` : `16x16x16 as 2x2 of 8x8x8, subgroups of ${fixedSubgroup}`;
    Object.assign(tensorCoreSupport, { available: true, reason: "", fragments });
  }
}

/**
 * Every device tfjs asks for gets the tensor-core features the adapter has, and shader
 * modules whose `enable` directives are hoisted above tfjs's prelude.
 */
function tensorCoreDevices(gpu: GpuLike): void {
  const request = gpu.requestAdapter.bind(gpu);
  gpu.requestAdapter = async (o?: object) => {
    const adapter = await request(o);
    if (!adapter) return adapter;
    const device = adapter.requestDevice.bind(adapter);
    adapter.requestDevice = async (d: { requiredFeatures?: string[]; requiredLimits?: Record<string, number> } = {}) => {
      // only where the tensor cores are there: other adapters (llvmpipe's compatibility mode) get the device they always got
      const tc = adapter.features?.has("shader-f16") && adapter.features.has("chromium-experimental-subgroup-matrix");
      const extra = tc ? TC_FEATURES.filter((f) => adapter.features?.has(f)) : [];
      webGpuInfo.requested = [...(d.requiredFeatures ?? []).flat(), ...extra];
      const dev = (await device({ ...d, requiredFeatures: [...(d.requiredFeatures ?? []), ...extra] })) as DeviceLike;
      const create = dev.createShaderModule.bind(dev);
      dev.createShaderModule = (desc: { code: string }) => insideNativeCall(() => create({ ...desc, code: rewriteF16Bindings(hoistDirectives(desc.code)) }));
      // tfjs compiles synchronously: a rank thread blocked in Dawn's compiler cannot tick its heartbeat
      const compile = dev.createComputePipeline?.bind(dev);
      if (compile) dev.createComputePipeline = (d: unknown) => insideNativeCall(() => compile(d));
      cacheBindGroups(dev as unknown as Parameters<typeof cacheBindGroups>[0], (globalThis as { GPUBuffer?: Parameters<typeof cacheBindGroups>[1] }).GPUBuffer);
      return dev;
    };
    return adapter;
  };
}

interface AdapterLike {
  limits: Record<string, number>;
  features?: Set<string>;
  info?: unknown;
  requestDevice(d?: { requiredFeatures?: string[]; requiredLimits?: Record<string, number> }): Promise<unknown>;
}
interface DeviceLike { createShaderModule(d: { code: string }): unknown; createComputePipeline?(d: unknown): unknown }
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
