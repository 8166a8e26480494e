// The one place that chooses and initialises the TensorFlow.js backend.
// `auto` prefers tfjs-node(-gpu) where it is installed (an optional dependency that
// cannot install on machines without its download host), else wasm.
import { isMainThread } from "node:worker_threads";
import * as tf from "@tensorflow/tfjs";

export type BackendName = "auto" | "wasm" | "cpu" | "tensorflow" | "webgpu";
export const BACKEND_NAMES: readonly BackendName[] = ["auto", "wasm", "cpu", "tensorflow", "webgpu"];

/** Importers are indirections so tests can make an import fail. */
export const backendImporters = {
  tensorflow: async (): Promise<unknown> => {
    try {
      return await import("@tensorflow/tfjs-node-gpu" as string);
    } catch {
      return await import("@tensorflow/tfjs-node" as string);
    }
  },
  wasm: async (): Promise<unknown> => import("@tensorflow/tfjs-backend-wasm"),
};

// Production mode: tfjs skips its debug checks and its "install tfjs-node" banner,
// which would otherwise print from every thread that touches the cpu backend.
tf.env().set("PROD", true);

let initialised: string | undefined;

function checkName(requested: string): BackendName {
  if (!BACKEND_NAMES.includes(requested as BackendName)) {
    throw new Error(`unknown engine backend '${requested}'; choose one of ${BACKEND_NAMES.join(", ")}`);
  }
  return requested as BackendName;
}

/**
 * The concrete backend a request maps to, without initialising anything:
 * `auto` becomes `tensorflow` when tfjs-node(-gpu) imports, else `wasm`.
 * Throws when `tensorflow` is requested explicitly and cannot load.
 */
export async function resolveBackendName(requested: BackendName | string = "auto"): Promise<Exclude<BackendName, "auto">> {
  const name = checkName(requested);
  if (name === "auto") {
    const failure = await importFailure("tensorflow");
    if (failure === undefined) return "tensorflow";
    reportAutoFallback(failure);
    return "wasm";
  }
  if (name === "tensorflow" && !(await tryImport("tensorflow"))) {
    throw new Error("engine backend 'tensorflow' needs @tensorflow/tfjs-node-gpu or @tensorflow/tfjs-node, which is not installed here; use 'wasm'");
  }
  return name;
}

/**
 * Initialise the backend once per thread and return the name in use.
 * Throws a clear error when an explicitly requested backend cannot load.
 */
export async function initBackend(requested: BackendName | string = "auto"): Promise<string> {
  checkName(requested);
  if (initialised && (requested === "auto" || requested === initialised)) return initialised;
  const name = await resolveBackendName(requested);
  if (name === "wasm") {
    await backendImporters.wasm();
    const hooks = await import("./wasm_kernels.js");
    hooks.registerWasmKernels();
  } else if (name === "webgpu") {
    const gpu = await import("./webgpu.js");
    await gpu.prepareWebGpu();
    // wasm beside it, not active: the host decoder's XNNPACK products (engine/host_kernels.ts)
    await backendImporters.wasm();
    if (!(await tf.setBackend("wasm"))) throw new Error("engine backend 'webgpu': the wasm backend beside it (host decoding) failed to initialise");
  }
  const ok = await tf.setBackend(name);
  if (!ok) throw new Error(`engine backend '${name}' failed to initialise`);
  await tf.ready();
  if (name === "webgpu") {
    const { capFreeBufferPool, freePoolLimits, nvidiaGpuMemoryBytes, exactReadBack } = await import("./webgpu_buffer_pool.js");
    const env = process.env.VERL_WEBGPU_FREE_POOL_MB;
    // every rank thread of a host shares its one GPU (Dawn cannot pick among identical ones): a share each
    const ranks = Math.max(1, Math.floor(Number(process.env.LOCAL_WORLD_SIZE)) || 1), gpu = env ? undefined : nvidiaGpuMemoryBytes();
    const limits = freePoolLimits(env, gpu === undefined ? undefined : gpu / ranks);
    capFreeBufferPool((tf.backend() as unknown as { bufferManager: Parameters<typeof capFreeBufferPool>[0] }).bufferManager, limits);
    exactReadBack(tf.backend() as unknown as Parameters<typeof exactReadBack>[0]); // size classes: read back a tensor's bytes only
    // the same uniforms bind the same buffer step after step, so bind groups are found again (uniform_cache.ts)
    (await import("./uniform_cache.js")).cacheUniforms(tf.backend() as unknown as Parameters<typeof import("./uniform_cache.js").cacheUniforms>[0]);
    reportDeviceErrors((tf.backend() as unknown as { device?: DeviceWithErrors }).device);
    if (process.env.VERL_LOG_PIPELINES === "1") logPipelines(tf.backend() as unknown as Parameters<typeof logPipelines>[0]);
    // tfjs's atomic split-K float32 product is wrong on NVIDIA (docs/gpu.md): the guarded BatchMatMul avoids it
    (await import("./webgpu_kernels.js")).guardFloat32MatMul();
    // tfjs submits its command encoder every N dispatches (15 by default); under Node the flag only
    // comes through tf.env (tfjs reads flags from a browser's URL), so VERL_WEBGPU_SUBMIT_BATCH sets it
    const batch = process.env.VERL_WEBGPU_SUBMIT_BATCH;
    if (batch !== undefined && batch !== "") {
      const n = Number(batch);
      if (!Number.isInteger(n) || n < 1) throw new Error(`VERL_WEBGPU_SUBMIT_BATCH must be a whole number of dispatches >= 1, got '${batch}'`);
      tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", n);
    }
  }
  if (process.env.VERL_FORBID_SYNC_READS === "1") {
    const { forbidSyncReads } = await import("./sync_reads.js");
    forbidSyncReads();
  }
  initialised = name;
  return name;
}

/**
 * VERL_LOG_PIPELINES=1: one stderr line per compute pipeline tfjs compiles (seconds since start, the
 * milliseconds createComputePipeline took, the shader key), to find what a run keeps compiling
 * (compiles block the host thread); bench/pipeline_summary.ts groups the lines.
 */
function logPipelines(backend: { pipelineCache: Record<string, unknown>; device: { createComputePipeline: (d: unknown) => unknown } }): void {
  const t0 = performance.now(), device = backend.device, create = device.createComputePipeline.bind(device);
  let n = 0, lastMs = 0;
  // tfjs compiles synchronously (createComputePipeline), then stores the pipeline under its key
  device.createComputePipeline = (d: unknown) => {
    const c0 = performance.now();
    try { return create(d); } finally { lastMs = performance.now() - c0; }
  };
  backend.pipelineCache = new Proxy(backend.pipelineCache, {
    set(target, key, value) {
      if (typeof key === "string" && !(key in target)) {
        process.stderr.write(`[verl-ts] pipeline ${++n} at ${((performance.now() - t0) / 1e3).toFixed(1)} s (${lastMs.toFixed(0)} ms): ${key.slice(0, 300)}\n`);
      }
      target[key as string] = value;
      return true;
    },
  });
}

interface DeviceWithErrors { onuncapturederror?: ((ev: { error?: { message?: string; constructor?: { name?: string } } }) => void) | null }

/**
 * Device errors no error scope caught (an out-of-memory buffer, a rejected pipeline) drop the submit
 * they belong to, and its outputs keep whatever their buffers held: say so on stderr, the first time
 * each kind of message comes (Dawn's skip_validation does not silence these).
 */
function reportDeviceErrors(device: DeviceWithErrors | undefined): void {
  if (!device) return;
  const seen = new Map<string, number>();
  try {
    device.onuncapturederror = (ev) => {
      const msg = ev.error?.message ?? String(ev.error), kind = ev.error?.constructor?.name ?? "GPUError", key = `${kind}: ${msg.split("\n")[0]!.slice(0, 200)}`;
      const n = (seen.get(key) ?? 0) + 1;
      seen.set(key, n);
      if (n === 1 || n === 10 || n === 1000) console.error(`[verl-ts] WebGPU device error (its commands were dropped; results that depend on them are wrong)${n > 1 ? `, ${n} times so far` : ""}: ${key}`);
    };
  } catch {
    // a binding without the handler attribute: nothing to hook
  }
}

async function tryImport(which: "tensorflow"): Promise<boolean> {
  return (await importFailure(which)) === undefined;
}

/** Why the backend's package does not import, or undefined when it does. */
async function importFailure(which: "tensorflow"): Promise<string | undefined> {
  try {
    await backendImporters[which]();
    return undefined;
  } catch (e) {
    return (e as Error).message.split("\n")[0];
  }
}

let fallbackReported = false;

/** trainer.device=auto without tfjs-node: said once per process (the driver), with the reason; rank threads stay quiet. */
function reportAutoFallback(reason: string): void {
  if (fallbackReported || !isMainThread) return;
  fallbackReported = true;
  const absent = /Cannot find (package|module)/.test(reason);
  process.stderr.write(
    `trainer.device=auto: using wasm, not tensorflow: ${absent
      ? "@tensorflow/tfjs-node-gpu is not installed (an optional dependency: npm drops it when its install script fails, which downloads libtensorflow from storage.googleapis.com; run `npm install @tensorflow/tfjs-node-gpu@4.22.0` to see why)"
      : `@tensorflow/tfjs-node-gpu is installed but does not load: ${reason}`}. Set trainer.device=wasm to silence this.\n`,
  );
}

/** What releaseBackend needs of tfjs-backend-webgpu's backend and its Dawn device. */
interface WebGpuBackendLike {
  device?: { queue: { onSubmittedWorkDone(): Promise<void> }; destroy(): void };
}

/**
 * Frees this thread's GPU before the thread is stopped: waits for the queue to drain, drops
 * tfjs's variables and buffers (removeBackend disposes the backend), destroys the Dawn device
 * and drops navigator.gpu. Stopping a rank thread whose Dawn device was still alive crashed the
 * process (docs/gpu.md). Nothing to do on the other backends. The thread cannot compute after it.
 */
export async function releaseBackend(): Promise<void> {
  if (initialised !== "webgpu") return;
  initialised = undefined;
  const backend = tf.findBackend("webgpu") as unknown as WebGpuBackendLike | null;
  const device = backend?.device;
  if (device) await device.queue.onSubmittedWorkDone();
  tf.disposeVariables();
  tf.removeBackend("webgpu");
  device?.destroy();
  const nav = (globalThis as { navigator?: { gpu?: unknown } }).navigator;
  if (nav && "gpu" in nav) Reflect.deleteProperty(nav, "gpu");
}

/** The backend in use, or undefined before `initBackend`. */
export function currentBackend(): string | undefined {
  return initialised;
}
