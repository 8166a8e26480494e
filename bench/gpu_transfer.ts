// Where a WebGPU read-back and upload spend their time (issue 23, two ranks: the gradient's
// 1.43 GB went back and forth at ~0.6 GB/s, where PCIe 5 gives ~50). For each size, the best of
// --reps runs of:
//   tfjs_read      tensor.data() as tfjs does it (pooled MAP_READ staging, copy, submit, mapAsync,
//                  getMappedRange().slice(0)), then a copy into a shared buffer (what the ranks do)
//   raw_read       the same steps on Dawn directly, each timed: copy (encode, submit, wait for the
//                  queue), map (mapAsync), view (getMappedRange), memcpy (into a SharedArrayBuffer
//                  view, the ranks' region), unmap; with the staging buffer made fresh or kept
//   chunked_read   the buffer in --chunk-mib pieces, each its own staging buffer, every copy in one
//                  submit and every mapAsync issued at once; each piece copied out as it maps
//   direct_read    src/engine/webgpu_transfer.ts as the optimizer reads its gradient: --chunk-mib buckets
//                  into pooled staging, one submit, each copied into the shared buffer as it maps
//   write_buffer   queue.writeBuffer of host values, then the queue drained
//   mapped_upload  a MAP_WRITE staging buffer mapped at creation, filled, unmapped, copied
//   kept_write_buffer, chunked_write_buffer (4 MiB writes), kept_mapped_upload (mapAsync, fill, unmap,
//                  copy; phases printed): the same into a destination and staging kept across reps
//   tfjs_upload    tf.tensor(values) and its upload (tfjs's staging path), the queue drained
//   direct_upload  uploadTensor with VERL_WEBGPU_UPLOAD_STAGING_MB=0 (webgpu_transfer.ts: writeBuffer into a pooled buffer), the queue drained
//   staged_upload  uploadTensor through kept MAP_WRITE staging (its default; made in the warm-up, reused)
// Prints one JSON line per size with GB/s for each (and the phases of raw_read).
//   bash scripts/gpu-run.sh node dist/bench/gpu_transfer.js [--mib 64,256,1024] [--chunk-mib 16] [--reps 3]
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.js";
import { readIntoBuckets, uploadStagingStats, uploadTensor } from "../src/engine/webgpu_transfer.js";
import { emit, loadAvg1m, machine, parseBenchArgs, runMain } from "./common.js";

const NAME = "gpu_transfer";
const MAP_READ = 0x1, MAP_WRITE = 0x2, COPY_SRC = 0x4, COPY_DST = 0x8, STORAGE = 0x80;
const MODE_READ = 0x1, MODE_WRITE = 0x2;

interface Buf { size: number; mapAsync(mode: number, offset?: number, size?: number): Promise<void>; getMappedRange(offset?: number, size?: number): ArrayBuffer; unmap(): void; destroy(): void }
interface Device {
  createBuffer(d: { size: number; usage: number; mappedAtCreation?: boolean }): Buf;
  createCommandEncoder(): { copyBufferToBuffer(s: Buf, so: number, d: Buf, dof: number, n: number): void; finish(): unknown };
  queue: { submit(cbs: unknown[]): void; onSubmittedWorkDone(): Promise<void>; writeBuffer(b: Buf, off: number, data: ArrayBufferView, dataOffset?: number, size?: number): void };
}

const gbps = (bytes: number, ms: number) => Number((bytes / ms / 1e6).toFixed(3));
const ms = (t0: number) => performance.now() - t0;
const r1 = (x: number) => Number(x.toFixed(1));

runMain(NAME, async () => {
  const args = parseBenchArgs(process.argv.slice(2), { reps: 3, warmup: 1 });
  const sizes = (args.extra.get("mib") ?? "64,256,1024").split(",").map(Number);
  const chunkBytes = Number(args.extra.get("chunk-mib") ?? "16") * 2 ** 20;
  if (sizes.some((s) => !(s > 0)) || !(chunkBytes > 0)) throw new Error("benchmark: --mib takes positive numbers of MiB, --chunk-mib a positive number");
  const backendName = await initBackend("webgpu");
  const load0 = loadAvg1m();
  const be = tf.backend() as unknown as { device: Device; submitQueue(): void; uploadToGPU(dataId: object): void; ensureCommandEncoderReady(): void; endComputePassEncoder(): void; tensorMap: { get(id: object): { resource?: unknown } | undefined } };
  const device = be.device;
  // tfjs's recorded work submitted and done (its open compute pass ended first)
  const drain = async () => {
    be.ensureCommandEncoderReady();
    be.endComputePassEncoder();
    be.submitQueue();
    await device.queue.onSubmittedWorkDone();
  };
  for (const mib of sizes) {
    const bytes = Math.round(mib * 2 ** 20 / 16) * 16, n = bytes / 4;
    const shared = new Float32Array(new SharedArrayBuffer(bytes));
    const host = new Float32Array(n).map((_, i) => (i % 1000) * 0.5);
    const best: Record<string, number> = {};
    const keep = (k: string, v: number) => { best[k] = Math.min(best[k] ?? Infinity, v); };
    const phases: Record<string, number> = {};
    // 1 + (i mod 2^24), made on the host: exact in float32 at every size (tfjs's float range stops
    // counting at 2^24 and its int32 mod is computed in float on WebGPU)
    // (× 1 so it lives in a GPU buffer, not in tfjs's pending upload)
    const src = tf.tidy(() => tf.mul(tf.tensor1d(Float32Array.from({ length: n }, (_, i) => (i % 2 ** 24) + 1)), 1));
    await drain();
    const srcBuf = be.tensorMap.get(src.dataId)!.resource as Buf;
    const kept = device.createBuffer({ size: bytes, usage: MAP_READ | COPY_DST });
    // every read must bring back src's values (checked at a few places)
    const verify = (what: string) => {
      for (const i of [0, 1, n >> 1, n - 1]) {
        const want = (i % 2 ** 24) + 1;
        if (shared[i] !== want) throw new Error(`${what}: value ${i} read back as ${shared[i]}, expected ${want}`);
      }
      shared.fill(0, 0, 2);
      shared[n - 1] = 0;
    };
    const keptDst = device.createBuffer({ size: bytes, usage: STORAGE | COPY_DST | COPY_SRC });
    const keptUp = device.createBuffer({ size: bytes, usage: MAP_WRITE | COPY_SRC, mappedAtCreation: true });
    let keptUpMapped = true;
    for (let rep = 0; rep < args.warmup + args.reps; rep++) {
      const timed = rep >= args.warmup;
      // tfjs: a fresh tensor each time (data() caches its values on the tensor)
      const t = tf.tidy(() => tf.mul(src, 1));
      await drain();
      let t0 = performance.now();
      const values = await t.data() as Float32Array;
      const tRead = ms(t0);
      t0 = performance.now();
      shared.set(values);
      const tCopyIn = ms(t0);
      verify("tfjs_read");
      t.dispose();
      if (timed) { keep("tfjs_read_ms", tRead); keep("tfjs_read_copy_in_ms", tCopyIn); }
      // raw, phase by phase, staging fresh and kept
      for (const fresh of [true, false]) {
        const staging = fresh ? device.createBuffer({ size: bytes, usage: MAP_READ | COPY_DST }) : kept;
        const p: Record<string, number> = {};
        let t1 = performance.now();
        const enc = device.createCommandEncoder();
        enc.copyBufferToBuffer(srcBuf, 0, staging, 0, bytes);
        device.queue.submit([enc.finish()]);
        await device.queue.onSubmittedWorkDone();
        p.copy = ms(t1); t1 = performance.now();
        await staging.mapAsync(MODE_READ);
        p.map = ms(t1); t1 = performance.now();
        const view = new Float32Array(staging.getMappedRange());
        p.view = ms(t1); t1 = performance.now();
        shared.set(view);
        p.memcpy = ms(t1); t1 = performance.now();
        staging.unmap();
        p.unmap = ms(t1);
        if (fresh) staging.destroy();
        verify(fresh ? "raw_read_fresh" : "raw_read_kept");
        const total = p.copy! + p.map! + p.view! + p.memcpy! + p.unmap!;
        const tag = fresh ? "raw_read_fresh" : "raw_read_kept";
        if (timed && total < (best[`${tag}_ms`] ?? Infinity)) {
          best[`${tag}_ms`] = total;
          for (const [k, v] of Object.entries(p)) phases[`${tag}_${k}_ms`] = r1(v);
        }
      }
      // chunked: every copy in one submit, every map issued at once, each piece copied out as it maps
      {
        const t1 = performance.now();
        const pieces: { at: number; buf: Buf }[] = [];
        const enc = device.createCommandEncoder();
        for (let at = 0; at < bytes; at += chunkBytes) {
          const len = Math.min(chunkBytes, bytes - at), buf = device.createBuffer({ size: len, usage: MAP_READ | COPY_DST });
          enc.copyBufferToBuffer(srcBuf, at, buf, 0, len);
          pieces.push({ at, buf });
        }
        device.queue.submit([enc.finish()]);
        await Promise.all(pieces.map(async ({ at, buf }) => {
          await buf.mapAsync(MODE_READ);
          shared.set(new Float32Array(buf.getMappedRange()), at / 4);
          buf.unmap();
          buf.destroy();
        }));
        if (timed) keep("chunked_read_ms", ms(t1));
        verify("chunked_read");
      }
      // the optimizer's path (a fresh tensor: its buffer is handed over and freed at once)
      {
        const t2 = tf.tidy(() => tf.mul(src, 1));
        await drain();
        const t1 = performance.now();
        await Promise.all(readIntoBuckets(t2, shared, 0, chunkBytes / 4));
        if (timed) keep("direct_read_ms", ms(t1));
        t2.dispose();
        verify("direct_read");
      }
      // uploads
      {
        const dst = device.createBuffer({ size: bytes, usage: STORAGE | COPY_DST | COPY_SRC });
        let t1 = performance.now();
        device.queue.writeBuffer(dst, 0, host);
        await device.queue.onSubmittedWorkDone();
        if (timed) keep("write_buffer_ms", ms(t1));
        t1 = performance.now();
        const up = device.createBuffer({ size: bytes, usage: MAP_WRITE | COPY_SRC, mappedAtCreation: true });
        new Float32Array(up.getMappedRange()).set(host);
        up.unmap();
        const enc = device.createCommandEncoder();
        enc.copyBufferToBuffer(up, 0, dst, 0, bytes);
        device.queue.submit([enc.finish()]);
        await device.queue.onSubmittedWorkDone();
        if (timed) keep("mapped_upload_ms", ms(t1));
        up.destroy();
        dst.destroy();
        // the same into buffers kept across reps (first touched in the warm-up): what is left when
        // neither the host staging nor the destination is fresh memory
        t1 = performance.now();
        device.queue.writeBuffer(keptDst, 0, host);
        await device.queue.onSubmittedWorkDone();
        if (timed) keep("kept_write_buffer_ms", ms(t1));
        t1 = performance.now();
        for (let o = 0; o < bytes; o += 4 * 2 ** 20) device.queue.writeBuffer(keptDst, o, host, o / 4, Math.min(4 * 2 ** 20, bytes - o) / 4);
        await device.queue.onSubmittedWorkDone();
        if (timed) keep("chunked_write_buffer_ms", ms(t1));
        t1 = performance.now();
        if (!keptUpMapped) await keptUp.mapAsync(MODE_WRITE);
        const tMap = performance.now();
        new Float32Array(keptUp.getMappedRange()).set(host);
        const tCopy = performance.now();
        keptUp.unmap();
        keptUpMapped = false;
        const enc2 = device.createCommandEncoder();
        enc2.copyBufferToBuffer(keptUp, 0, keptDst, 0, bytes);
        device.queue.submit([enc2.finish()]);
        await device.queue.onSubmittedWorkDone();
        if (timed) {
          keep("kept_mapped_upload_ms", ms(t1));
          phases.kept_mapped_upload_map_ms = r1(tMap - t1);
          phases.kept_mapped_upload_memcpy_ms = r1(tCopy - tMap);
          phases.kept_mapped_upload_copy_ms = r1(performance.now() - tCopy);
        }
        // uploadTensor with VERL_WEBGPU_UPLOAD_STAGING_MB at `mb` (0: writeBuffer)
        const withStaging = (mb: number) => () => {
          process.env.VERL_WEBGPU_UPLOAD_STAGING_MB = String(mb);
          try { return uploadTensor(host, [n]); } finally { delete process.env.VERL_WEBGPU_UPLOAD_STAGING_MB; }
        };
        const uploads = [["tfjs_upload", () => tf.tensor(host, [n], "float32")], ["direct_upload", withStaging(0)], ["staged_upload", withStaging(Math.ceil(bytes / 2 ** 20) + 16)]] as const;
        for (const [tag, make] of uploads) {
          t1 = performance.now();
          const u = make();
          be.uploadToGPU(u.dataId); // what tfjs does before a kernel reads it (a no-op for the direct one)
          await drain();
          if (timed) keep(`${tag}_ms`, ms(t1));
          u.dispose();
        }
        // the kept staging buffers mapped again before the next rep (untimed)
        for (let k = 0; k < 500; k++) {
          const st = uploadStagingStats();
          if (st.readyBytes >= st.madeBytes) break;
          await new Promise((r) => setTimeout(r, 2));
        }
      }
    }
    kept.destroy();
    keptDst.destroy();
    keptUp.destroy();
    src.dispose();
    const figures: Record<string, number> = { bytes };
    for (const [k, v] of Object.entries(best)) {
      figures[k] = r1(v);
      figures[k.replace(/_ms$/, "_gbps")] = gbps(bytes, v);
    }
    Object.assign(figures, phases);
    emit({ name: NAME, config: { mib, chunk_mib: chunkBytes / 2 ** 20, reps: args.reps }, figures, machine: machine(backendName, load0) });
  }
});
