// A recorded decode step, replayed: what CUDA graphs give vLLM, for WebGPU under tfjs.
//
// A decode step records the same ~300 dispatches every step (same programs, same buffers, same
// workgroup counts); only a few uniforms (the cache column, the rotary offset, the sampler's step)
// move on by one. Through tfjs each dispatch costs the host ~30 us (shader key, uniform packing,
// a pooled uniform buffer and its upload, a bind group, tensor bookkeeping): 8.6 ms of host time
// a 0.5B decode step on an H100, 1.3-2.0 ms replayed (docs/gpu.md). `RecordedStep.capture` runs one step through tfjs as usual while
// it notes every dispatch (pipeline, bind group, workgroups), gives each dispatch's uniforms a
// slot of one arena buffer of its own, and keeps every buffer the step touched alive. `replay(k)`
// then writes the arena once (the marked uniforms advanced k steps) and encodes the noted
// dispatches into one command buffer: a few Dawn calls a dispatch, no tfjs.
//
// A step that does anything but dispatch programs (uploads host values, reads back, copies,
// times) is not captured: `capture` says why and the caller records every step through tfjs.
// Nothing else may use the backend between replays of a step that feeds itself (the decoder
// owns the thread during generate).

/** A program's uniform value as tfjs takes it; `perStep` marks one that advances by that much a step when replayed. */
export interface SteppedUniform { type: "int32" | "float32" | "uint32"; data: number[]; perStep?: number }

/** `u` marked to advance by `perStep` every replayed step (int32 and uint32 scalars only). */
export function advancing<T extends SteppedUniform>(u: T, perStep = 1): T {
  if (u.type === "float32" || u.data.length !== 1) throw new Error(`advancing: only int32/uint32 scalars can advance per step, got ${u.type}[${u.data.length}]`);
  return { ...u, perStep };
}

/**
 * tfjs's uniform block layout (backend_webgpu.ts makeUniforms, which writes the struct its
 * shaders declare): each value aligned to 4, 8 or 16 bytes by its length, 16 after a 5- or
 * 6-long one, the block rounded to its largest alignment. test/engine/webgpu_replay.test.ts
 * checks it against tfjs's own bytes.
 */
export function packUniforms(values: readonly SteppedUniform[]): { bytes: ArrayBuffer; offsets: number[] } {
  let at = 0, prev = 0, maxAlign = 1;
  const offsets: number[] = [];
  for (const v of values) {
    const n = Math.max(1, v.data.length);
    if (n > 6) throw new Error(`packUniforms: a ${n}-long uniform (tfjs takes at most 6)`);
    let align = n === 1 ? 4 : n === 2 ? 8 : 16;
    if (prev === 5 || prev === 6) align = 16;
    maxAlign = Math.max(maxAlign, align);
    at = Math.ceil(at / align) * align;
    offsets.push(at);
    at += n * 4;
    prev = n;
  }
  const bytes = new ArrayBuffer(Math.ceil(at / maxAlign) * maxAlign);
  values.forEach((v, i) => {
    const data = v.data.length ? v.data : [1];
    const View = v.type === "int32" ? Int32Array : v.type === "uint32" ? Uint32Array : Float32Array;
    new View(bytes, offsets[i]!, data.length).set(data);
  });
  return { bytes, offsets };
}

interface GpuBufferLike { size: number; mapAsync(mode: number): Promise<void>; getMappedRange(): ArrayBuffer; unmap(): void; destroy(): void }
interface PassLike { setPipeline(p: unknown): void; setBindGroup(i: number, g: unknown): void; dispatchWorkgroups(x: number, y: number, z: number): void; end(): void }
interface EncoderLike {
  beginComputePass(d?: object): PassLike; copyBufferToBuffer(src: unknown, so: number, dst: unknown, d0: number, n: number): void; finish(): unknown;
  resolveQuerySet(q: unknown, first: number, count: number, dst: unknown, off: number): void;
}
interface DeviceLike {
  limits: { minUniformBufferOffsetAlignment: number };
  createBuffer(d: { size: number; usage: number }): GpuBufferLike;
  createCommandEncoder(): EncoderLike;
  createBindGroup(d: unknown): unknown;
  createQuerySet(d: { type: string; count: number }): { destroy(): void };
  features: { has(f: string): boolean };
  queue: { writeBuffer(b: unknown, off: number, data: ArrayBuffer | ArrayBufferView, dOff?: number, size?: number): void; submit(c: unknown[]): void };
}
interface ProgramLike { pipeline?: unknown; dispatch?: number[]; shaderKey?: string; constructor: { name: string } }
interface TensorData { dtype: string; shape: number[]; values?: unknown; refCount: number; resource?: unknown }
/** The tfjs WebGPU backend's members this module takes part in. */
export interface ReplayBackend {
  device: DeviceLike;
  tensorMap: { get(id: object): TensorData | undefined };
  commandEncoder: unknown;
  activeTimers?: unknown;
  endComputePassEncoder(): void;
  submitQueue(): void;
  recordAndSubmit(program: ProgramLike, output: unknown, inputs: unknown[], uniforms?: SteppedUniform[]): void;
  makeUniforms(values: SteppedUniform[]): { offset: number; size: number; buffer: unknown };
  disposeData(id: object, force?: boolean): boolean;
  uploadToGPU(id: object): void;
  copyBuffer?(b: unknown): unknown;
  getBufferData?(b: unknown): Promise<unknown>;
}

const usage = () => (globalThis as unknown as { GPUBufferUsage: Record<string, number> }).GPUBufferUsage;
const mapRead = () => (globalThis as unknown as { GPUMapMode: { READ: number } }).GPUMapMode.READ;

/** Submits what tfjs has recorded, so that what is encoded next runs after it. */
export function submitRecorded(be: Pick<ReplayBackend, "commandEncoder" | "endComputePassEncoder" | "submitQueue">): void {
  be.endComputePassEncoder();
  if (be.commandEncoder) be.submitQueue();
}

/** The GPU buffer of a tensor on the WebGPU backend. */
export function bufferOf(be: ReplayBackend, dataId: object): GpuBufferLike {
  const d = be.tensorMap.get(dataId);
  if (!d) throw new Error("bufferOf: the tensor is not on this backend");
  be.uploadToGPU(dataId);
  return d.resource as GpuBufferLike;
}

/**
 * Reads a buffer's first `bytes` back through a ring of staging buffers: `copy` encodes the copy
 * into the next one, `read` (after the encoder was submitted) maps it. A step is queued before the
 * last one is read, so two are in flight; the ring holds three.
 */
export class ReadBackRing {
  private readonly staging: GpuBufferLike[];
  private next = 0;
  constructor(private readonly device: DeviceLike, private readonly source: GpuBufferLike, readonly bytes: number, size = 3) {
    this.staging = Array.from({ length: size }, () => device.createBuffer({ size: bytes, usage: usage().MAP_READ! | usage().COPY_DST! }));
  }
  /** Encodes the copy; the returned function maps it once the encoder has been submitted. */
  copy(encoder: EncoderLike): () => Promise<ArrayBuffer> {
    const b = this.staging[this.next]!;
    this.next = (this.next + 1) % this.staging.length;
    encoder.copyBufferToBuffer(this.source, 0, b, 0, this.bytes);
    return async () => {
      await b.mapAsync(mapRead());
      const out = b.getMappedRange().slice(0);
      b.unmap();
      return out;
    };
  }
  /** The buffer as it stands after everything submitted so far (tfjs's recording included). */
  readNow(be: ReplayBackend): Promise<ArrayBuffer> {
    submitRecorded(be);
    const enc = this.device.createCommandEncoder(), map = this.copy(enc);
    this.device.queue.submit([enc.finish()]);
    return map();
  }
  dispose(): void { for (const b of this.staging) b.destroy(); }
}

interface Dispatch { pipeline: unknown; group: unknown; x: number; y: number; z: number; program: string }

/** Device time of one dispatch of a timed replay: the program's class and shader key, milliseconds. */
export interface DispatchTime { program: string; groups: [number, number, number]; ms: number }
interface Advance { at: number; type: "int32" | "uint32"; value: number; perStep: number }

/** Uniform slots of one buffer, one a dispatch, at the device's offset alignment; mirrored on the host. */
class UniformArena {
  readonly buffer: GpuBufferLike;
  readonly host: ArrayBuffer;
  used = 0;
  private written = 0;
  constructor(private readonly device: DeviceLike, readonly capacity: number) {
    this.buffer = device.createBuffer({ size: capacity, usage: usage().UNIFORM! | usage().COPY_DST! });
    this.host = new ArrayBuffer(capacity);
  }
  place(bytes: ArrayBuffer): number | undefined {
    const align = this.device.limits.minUniformBufferOffsetAlignment || 256;
    const at = Math.ceil(this.used / align) * align;
    if (at + bytes.byteLength > this.capacity) return undefined;
    new Uint8Array(this.host, at, bytes.byteLength).set(new Uint8Array(bytes));
    this.used = at + bytes.byteLength;
    return at;
  }
  /** Uploads what was placed since the last upload (capture: before any of its dispatches is submitted). */
  flush(): void {
    if (this.used > this.written) this.device.queue.writeBuffer(this.buffer, this.written, this.host, this.written, this.used - this.written);
    this.written = this.used;
  }
  /** Uploads the whole block (a replay: the advanced values). */
  upload(): void { this.device.queue.writeBuffer(this.buffer, 0, this.host, 0, Math.ceil(this.used / 4) * 4); }
}

/** What `capture` found when it could not record a replayable step. */
export interface CaptureRefusal { reason: string }

export class RecordedStep {
  /** dispatches recorded */
  get dispatches(): number { return this.commands.length; }
  /** bytes of buffers kept alive for the replays (the step's intermediates) */
  readonly heldBytes: number;
  private disposed = false;

  private constructor(private readonly be: ReplayBackend, private readonly commands: Dispatch[], private readonly arena: UniformArena,
    private readonly advances: Advance[], private readonly held: object[], private readonly release: (id: object) => void, heldBytes: number) {
    this.heldBytes = heldBytes;
  }

  /**
   * Runs `fn` (one step, recorded through tfjs) and notes its dispatches. The step runs either
   * way; the result is a RecordedStep, or why its dispatches cannot be replayed. Buffers that the
   * step frees are kept (up to `maxHeldBytes`) until `dispose`, so the replays find them unchanged.
   */
  static capture(be: ReplayBackend, fn: () => void, opts: { maxHeldBytes?: number; maxDispatches?: number } = {}): RecordedStep | CaptureRefusal {
    if (be.activeTimers) return { reason: "tf.time is timing programs" };
    submitRecorded(be);
    const device = be.device, maxHeld = opts.maxHeldBytes ?? Infinity;
    const arena = new UniformArena(device, (opts.maxDispatches ?? 4096) * Math.max(256, device.limits.minUniformBufferOffsetAlignment || 256));
    const commands: Dispatch[] = [], advances: Advance[] = [], held: object[] = [], problems: string[] = [];
    let heldBytes = 0, group: unknown;
    const orig = { record: be.recordAndSubmit, uniforms: be.makeUniforms, dispose: be.disposeData, upload: be.uploadToGPU, submit: be.submitQueue, copy: be.copyBuffer, read: be.getBufferData, bind: device.createBindGroup };
    const release = (id: object) => orig.dispose.call(be, id, true);
    be.makeUniforms = (values) => {
      const { bytes, offsets } = packUniforms(values);
      const at = arena.place(bytes);
      if (at === undefined) { problems.push(`more than ${arena.capacity} bytes of uniforms`); return orig.uniforms.call(be, values); }
      values.forEach((v, i) => {
        if (v.perStep) advances.push({ at: at + offsets[i]!, type: v.type as "int32" | "uint32", value: v.data[0]!, perStep: v.perStep });
      });
      return { offset: at, size: bytes.byteLength, buffer: arena.buffer };
    };
    device.createBindGroup = (d: unknown) => (group = orig.bind.call(device, d));
    be.recordAndSubmit = function (this: ReplayBackend, program, output, inputs, uniforms) {
      group = undefined;
      orig.record.call(this, program, output, inputs, uniforms);
      const [x = 1, y = 1, z = 1] = program.dispatch ?? [];
      if (group === undefined || !program.pipeline) problems.push(`${program.constructor.name} recorded no bind group`);
      commands.push({ pipeline: program.pipeline, group, x, y, z, program: `${program.constructor.name} ${program.shaderKey ?? ""}` });
    };
    be.submitQueue = function (this: ReplayBackend) { arena.flush(); orig.submit.call(this); };
    be.uploadToGPU = function (this: ReplayBackend, id) {
      const d = this.tensorMap.get(id);
      if (d && d.resource == null && d.values != null) problems.push(`the step uploads host values (a ${d.dtype} [${d.shape}] tensor)`);
      orig.upload.call(this, id);
    };
    if (orig.copy) be.copyBuffer = function (this: ReplayBackend, b) { problems.push("the step copies a buffer"); return orig.copy!.call(this, b); };
    if (orig.read) be.getBufferData = function (this: ReplayBackend, b) { problems.push("the step reads a buffer back"); return orig.read!.call(this, b); };
    be.disposeData = function (this: ReplayBackend, id, force = false) {
      const d = this.tensorMap.get(id);
      // a view's dispose only drops a reference; the last one is kept until the replays end
      if (!d || (!force && d.refCount > 1) || d.resource == null) return orig.dispose.call(this, id, force);
      held.push(id);
      heldBytes += (d.resource as GpuBufferLike).size;
      return true;
    };
    try {
      fn();
    } finally {
      Object.assign(be, { recordAndSubmit: orig.record, makeUniforms: orig.uniforms, disposeData: orig.dispose, uploadToGPU: orig.upload, submitQueue: orig.submit });
      if (orig.copy) be.copyBuffer = orig.copy;
      if (orig.read) be.getBufferData = orig.read;
      device.createBindGroup = orig.bind;
      // the step's own uniforms must be in place before its dispatches run
      arena.flush();
      submitRecorded(be);
    }
    if (heldBytes > maxHeld) problems.push(`its intermediates take ${(heldBytes / 2 ** 20).toFixed(0)} MiB, over the ${(maxHeld / 2 ** 20).toFixed(0)} MiB allowed (VERL_WEBGPU_REPLAY_MB)`);
    if (commands.length === 0) problems.push("the step dispatched nothing");
    if (problems.length) {
      for (const id of held) release(id);
      arena.buffer.destroy();
      return { reason: [...new Set(problems)].join("; ") };
    }
    return new RecordedStep(be, commands, arena, advances, held, release, heldBytes);
  }

  /**
   * Queues the step `k` steps after the captured one (its marked uniforms advanced k times), with
   * `read`'s copy after it; returns the read, to be awaited.
   */
  replay(k: number, read?: ReadBackRing): Promise<ArrayBuffer> | undefined {
    const enc = this.begin(k), pass = enc.beginComputePass();
    let pipeline: unknown;
    for (const c of this.commands) {
      if (c.pipeline !== pipeline) pass.setPipeline((pipeline = c.pipeline));
      pass.setBindGroup(0, c.group);
      pass.dispatchWorkgroups(c.x, c.y, c.z);
    }
    pass.end();
    const map = read?.copy(enc);
    this.be.device.queue.submit([enc.finish()]);
    return map?.();
  }

  /**
   * The same as `replay`, each dispatch in a compute pass of its own with timestamps around it
   * (the device's 'timestamp-query'; Dawn rounds them unless its toggle timestamp_quantization is
   * disabled): also resolves to each dispatch's device time, in order.
   */
  replayTimed(k: number, read?: ReadBackRing): { read?: Promise<ArrayBuffer>; times: Promise<DispatchTime[]> } {
    const device = this.be.device, n = this.commands.length;
    if (!device.features.has("timestamp-query")) throw new Error("RecordedStep.replayTimed: the device has no 'timestamp-query'");
    const u = usage(), queries = device.createQuerySet({ type: "timestamp", count: 2 * n });
    const resolved = device.createBuffer({ size: 16 * n, usage: u.QUERY_RESOLVE! | u.COPY_SRC! }), staging = device.createBuffer({ size: 16 * n, usage: u.MAP_READ! | u.COPY_DST! });
    const enc = this.begin(k);
    this.commands.forEach((c, i) => {
      const pass = enc.beginComputePass({ timestampWrites: { querySet: queries, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 } });
      pass.setPipeline(c.pipeline);
      pass.setBindGroup(0, c.group);
      pass.dispatchWorkgroups(c.x, c.y, c.z);
      pass.end();
    });
    enc.resolveQuerySet(queries, 0, 2 * n, resolved, 0);
    enc.copyBufferToBuffer(resolved, 0, staging, 0, 16 * n);
    const map = read?.copy(enc);
    device.queue.submit([enc.finish()]);
    const times = (async () => {
      try {
        await staging.mapAsync(mapRead());
        const t = new BigUint64Array(staging.getMappedRange().slice(0));
        staging.unmap();
        return this.commands.map((c, i): DispatchTime => ({ program: c.program, groups: [c.x, c.y, c.z], ms: Number(t[2 * i + 1]! - t[2 * i]!) / 1e6 }));
      } finally {
        staging.destroy();
        resolved.destroy();
        queries.destroy();
      }
    })();
    return { read: map?.(), times };
  }

  /** An encoder for the step k steps after the captured one, its uniforms written. */
  private begin(k: number): EncoderLike {
    if (this.disposed) throw new Error("RecordedStep: replayed after dispose");
    const i32 = new Int32Array(this.arena.host), u32 = new Uint32Array(this.arena.host);
    for (const a of this.advances) (a.type === "uint32" ? u32 : i32)[a.at / 4] = a.value + k * a.perStep;
    submitRecorded(this.be);
    this.arena.upload();
    return this.be.device.createCommandEncoder();
  }

  /** Frees what the replays kept (the step's intermediates, the uniform block). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    submitRecorded(this.be);
    for (const id of this.held) this.release(id);
    this.arena.buffer.destroy();
  }
}

export function isRefusal(r: RecordedStep | CaptureRefusal): r is CaptureRefusal {
  return !(r instanceof RecordedStep);
}
