// The bucketed gradient read-back on a backend (dp_optimizer.ts: every bucket's read starts at
// once, bucket i is reduced as soon as it is in): are the buckets the whole read's bits, and how
// soon is the first one on the host against the whole gradient? Prints one JSON line.
//   bash scripts/gpu-run.sh node dist/bench/gpu_buckets.js --backend webgpu [--mib 64] [--bucket-mib 16] [--reps 3]
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { FlatGradAccumulator } from "../src/engine/optim/grad_utils.js";

function flag(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : fallback;
}

async function main(): Promise<void> {
  const backend = await initBackend(flag("backend", "webgpu"));
  const n = (Number(flag("mib", "64")) << 20) / 4, bucket = (Number(flag("bucket-mib", "16")) << 20) / 4, reps = Number(flag("reps", "3"));
  const v = tf.variable(tf.zeros([n]), true, "g");
  const acc = new FlatGradAccumulator([v]);
  const fill = (seed: number) => {
    const g = tf.randomNormal([n], 0, 1, "float32", seed);
    acc.add({ g });
    g.dispose();
  };
  const rows: { whole_ms: number; first_bucket_ms: number; all_buckets_ms: number; identical: boolean }[] = [];
  for (let r = 0; r < reps + 1; r++) {
    fill(r);
    fill(r + 100);
    let t = performance.now();
    const whole = await acc.take();
    const wholeMs = performance.now() - t;
    fill(r);
    fill(r + 100);
    t = performance.now();
    const parts = acc.takeBuckets(bucket);
    const got = new Float32Array(n);
    let first = 0;
    for (let i = 0; i < parts.length; i++) {
      got.set(await parts[i]!, i * bucket);
      if (i === 0) first = performance.now() - t;
    }
    const allMs = performance.now() - t;
    const a = new Uint32Array(whole.buffer, whole.byteOffset, n), b = new Uint32Array(got.buffer, 0, n);
    let same = true;
    for (let i = 0; i < n && same; i++) same = a[i] === b[i];
    if (r > 0) rows.push({ whole_ms: Math.round(wholeMs * 10) / 10, first_bucket_ms: Math.round(first * 10) / 10, all_buckets_ms: Math.round(allMs * 10) / 10, identical: same });
  }
  process.stdout.write(`${JSON.stringify({ name: "gpu_buckets", backend, mib: (n * 4) / (1 << 20), bucket_mib: (bucket * 4) / (1 << 20), rows })}\n`);
  acc.dispose();
  v.dispose();
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`);
  process.exitCode = 1;
});
