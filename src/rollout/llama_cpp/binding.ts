// Loading node-llama-cpp (an optional dependency, pinned to 3.21.1) and its
// prebuilt llama.cpp: never a download or a source build at run time (build:
// "never"). Only the few calls the engine makes are typed here, so the project
// compiles without the package installed.

export interface LlamaSequenceOutput { token: number; confidence?: number }

export interface LlamaContextSequence {
  clearHistory(): Promise<void>;
  /** The tokens whose state the sequence holds (the request server reuses a shared prefix). */
  readonly contextTokens: number[];
  readonly nextTokenIndex: number;
  eraseContextTokenRanges(ranges: { start: number; end: number }[]): Promise<void>;
  evaluateWithMetadata(
    tokens: number[], metadata: { confidence: true },
    options: { temperature: number; topK: number; topP: number; minP: number; seed: number; yieldEogToken: boolean },
  ): AsyncGenerator<LlamaSequenceOutput, void, void | number | number[]>;
  dispose(): Promise<void> | void;
}

export interface LlamaContext {
  getSequence(): LlamaContextSequence;
  readonly contextSize: number;
  dispose(): Promise<void>;
}

export interface LlamaContextOptions {
  sequences: number;
  contextSize: number;
  batchSize: number;
  threads?: number;
  flashAttention?: boolean;
  experimentalKvCacheKeyType?: string;
  experimentalKvCacheValueType?: string;
  batching?: { dispatchSchedule: (dispatch: () => void) => void };
  ignoreMemorySafetyChecks?: boolean;
  failedCreationRemedy?: false;
}

export interface LlamaModelHandle {
  createContext(opts: LlamaContextOptions): Promise<LlamaContext>;
  dispose(): Promise<void>;
}

export interface Llama {
  readonly gpu: string | false;
  loadModel(opts: { modelPath: string; gpuLayers: number | "max"; useMmap?: boolean; checkTensors?: boolean; ignoreMemorySafetyChecks?: boolean }): Promise<LlamaModelHandle>;
  dispose?(): Promise<void>;
}

interface NodeLlamaCppModule {
  getLlama(opts: Record<string, unknown>): Promise<Llama>;
  LlamaLogLevel: Record<string, string>;
}

export const NODE_LLAMA_CPP_VERSION = "3.21.1";

/** Which llama.cpp build: "auto" (a GPU build when one works, else CPU), "cpu", "vulkan" or "cuda". */
export type LlamaGpuSetting = "auto" | "cpu" | "vulkan" | "cuda";

const loaded = new Map<LlamaGpuSetting, Promise<Llama>>();

/** Import node-llama-cpp (the specifier is a parameter: tsc must not resolve an optional package, and tests name a missing one). */
export async function importNodeLlamaCpp(specifier = "node-llama-cpp"): Promise<NodeLlamaCppModule> {
  try {
    return (await import(specifier)) as NodeLlamaCppModule;
  } catch (e) {
    throw new Error(
      `actor_rollout_ref.rollout.name=llama_cpp needs the optional package node-llama-cpp@${NODE_LLAMA_CPP_VERSION} ` +
      `(installed on request: bash scripts/install-optional.sh llama, or npm install --no-save node-llama-cpp@${NODE_LLAMA_CPP_VERSION}), which could not be loaded: ${(e as Error).message}`,
    );
  }
}

/** The process's llama.cpp binding for `gpu` (loaded once). */
export function loadLlama(gpu: LlamaGpuSetting): Promise<Llama> {
  let p = loaded.get(gpu);
  if (!p) {
    p = (async () => {
      const mod = await importNodeLlamaCpp();
      try {
        return await mod.getLlama({
          gpu: gpu === "cpu" ? false : gpu, build: "never", usePrebuiltBinaries: true, skipDownload: true,
          progressLogs: false, logLevel: mod.LlamaLogLevel.error ?? "error",
        });
      } catch (e) {
        throw new Error(`llama_cpp rollout: no prebuilt llama.cpp binary for gpu=${gpu} loads here (node-llama-cpp builds nothing at run time): ${(e as Error).message}`);
      }
    })();
    p.catch(() => loaded.delete(gpu));
    loaded.set(gpu, p);
  }
  return p;
}
