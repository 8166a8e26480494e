// For tests that need a WebGPU adapter: "" when the webgpu backend is up, else why not (the test skips with it).
import { initBackend } from "../../src/engine/backend.js";

export async function webgpuOrReason(): Promise<string> {
  try {
    await initBackend("webgpu");
    return "";
  } catch (e) {
    return `no WebGPU adapter here (${(e as Error).message.split("\n")[0]})`;
  }
}
