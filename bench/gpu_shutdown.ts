// Does a ResourcePool of WebGPU rank threads shut down without crashing? (docs/gpu.md: two rank
// threads with their own Dawn devices trained, then the process segfaulted when the pool stopped
// them.) Each rank initialises webgpu, runs a few matrix products on a variable, reads the result;
// then the pool is destroyed and the process exits on its own. Prints one line per stage, so the
// last line before a crash says where it happened; the exit code says the rest.
//   bash scripts/gpu-run.sh node dist/bench/gpu_shutdown.js --ranks 2 [--no-hook] [--release] [--pin] [--driver-gpu] [--backend wasm]
// By default each rank registers releaseBackend() (engine/backend.ts) with onThreadClose, so
// pool.destroy() runs it in every thread before stopping them (what the training workers do).
// --no-hook: not registered (threads stopped with their Dawn devices alive, as before the fix)
// --release: each rank calls releaseBackend() through a worker method before the pool stops it
// --pin: the driver loads the `webgpu` package (dawn.node) without creating a device
// --driver-gpu: the driver also initialises webgpu (its own Dawn device)
import * as tf from "@tensorflow/tfjs";
import { isMainThread } from "node:worker_threads";
import { fileURLToPath } from "node:url";
import { initBackend, releaseBackend } from "../src/engine/backend.js";
import { ClassWithInitArgs, onThreadClose, register, ResourcePool, Worker, WorkerGroup } from "../src/single_controller/index.js";

export class GpuProbe extends Worker {
  private w: tf.Variable | undefined;

  @register()
  async compute(backend: string, hook: boolean): Promise<{ rank: number; backend: string; sum: number }> {
    const name = await initBackend(backend);
    if (hook) onThreadClose(releaseBackend);
    this.w ??= tf.variable(tf.randomNormal([512, 512], 0, 0.05, "float32", 7 + this.rank));
    const out = tf.tidy(() => {
      let x = tf.ones([64, 512]) as tf.Tensor2D;
      for (let i = 0; i < 8; i++) x = tf.tanh(tf.matMul(x, this.w! as tf.Tensor2D)) as tf.Tensor2D;
      return x.sum();
    });
    const sum = (await out.data())[0]!;
    out.dispose();
    return { rank: this.rank, backend: name, sum };
  }

  @register()
  async release(): Promise<number> {
    await releaseBackend();
    return this.rank;
  }
}

async function main(argv: string[]): Promise<void> {
  const has = (k: string) => argv.includes(k);
  const at = (k: string, d: string) => (argv.indexOf(k) >= 0 ? argv[argv.indexOf(k) + 1] ?? d : d);
  const ranks = Number(at("--ranks", "2"));
  const backend = at("--backend", "webgpu");
  const say = (s: string) => console.log(`[shutdown-probe ranks=${ranks} ${argv.join(" ")}] ${s}`);
  process.on("exit", (code) => say(`process exit ${code}`));
  if (has("--pin")) {
    await import("webgpu" as string);
    say("driver loaded dawn.node");
  }
  if (has("--driver-gpu")) say(`driver backend ${await initBackend(backend)}`);
  const pool = new ResourcePool({ worldSize: ranks, name: "shutdown_probe" });
  const group = await WorkerGroup.create<GpuProbe>(pool, new ClassWithInitArgs(import.meta.url, "GpuProbe"));
  for (let step = 0; step < 2; step++) say(`compute ${JSON.stringify(await group.compute(backend, !has("--no-hook")))}`);
  if (has("--release")) say(`released ${JSON.stringify(await group.release())}`);
  const t0 = Date.now();
  await pool.destroy();
  say(`pool destroyed in ${Date.now() - t0} ms`);
}

if (isMainThread && process.argv[1] === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(e);
    process.exitCode = 1;
  });
}
