// One WebAssembly memory holding a decoder's SIMD-side buffers, carved into
// 16-byte-aligned float regions up front. It is sized once and never grows, so
// Float32Array views of it stay valid.
import { simdSupported } from "./asm.js";
import { wasmApi, type WasmMemory } from "./wasm_api.js";

export class SimdArena {
  readonly memory: WasmMemory;
  private at = 0;

  /** An arena for `floats` floats in all (plus alignment), or undefined where SIMD is unavailable or it would not fit. */
  static create(floats: number, regions: number): SimdArena | undefined {
    const bytes = 4 * floats + 16 * regions + 64;
    if (!simdSupported() || bytes >= 2 ** 32) return undefined;
    return new SimdArena(bytes);
  }

  private constructor(readonly bytes: number) {
    this.memory = new wasmApi.Memory({ initial: Math.ceil(bytes / 65536) });
  }

  /** A region of n floats; returns its byte offset. */
  take(n: number): number {
    const at = this.at;
    this.at = (at + 4 * n + 15) & ~15;
    if (this.at > this.bytes) throw new Error(`SimdArena: ${this.bytes} bytes exhausted`);
    return at;
  }

  view(at: number, n: number): Float32Array {
    return new Float32Array(this.memory.buffer, at, n);
  }
}
