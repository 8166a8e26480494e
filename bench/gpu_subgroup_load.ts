// Which subgroup-matrix loads from workgroup memory the GPU gets right (issue 23): the staged GEMM
// kernels, proven in bounds and exact on the CPU checker and right on lavapipe, come back wrong on
// NVIDIA (a shift of -6 with 16 halves of row padding, right without). This probe takes the
// kernels' steps one at a time, outside tfjs, on the raw device:
//   fill    a workgroup array of f16 (scalar stores, as the staged kernel writes it), barrier
//   load    one 16 x 16 fragment (left or right, row- or column-major) at OFFSET with row STRIDE
//   read    the fragment out through a product with the identity, stored to a storage buffer
// and compares every element with the array element the WGSL spec says the load reads. Offsets
// and strides are runtime values (one pipeline per kind and major) or shader constants (`const`
// cases), loads come from workgroup or storage memory, and the `cross` cases fill the array from
// four subgroups and load a fragment another subgroup wrote (the staged kernel's pattern).
//   bash scripts/gpu-run.sh node dist/bench/gpu_subgroup_load.js [--strides 16,32,...] [--offsets 0,16,...]
// One JSON line per case group, then a summary line: the (space, kind, major, stride, offset)
// combinations that failed and, where the wrong values are one exact shift of the right ones, the shift.
import { prepareWebGpu, webGpuSummary } from "../src/engine/webgpu.js";
import { fragmentGeometry } from "../src/engine/subgroup_fragments.js";
import { floatToHalf } from "../src/models/gguf.js";

/* eslint-disable @typescript-eslint/no-explicit-any -- the raw WebGPU objects of dawn.node */
type Dev = any;

const MOD = 2039; // a prime below 2048: f16 holds every residue exactly, and a shift shows as a residue difference
const value = (i: number) => i % MOD;

interface Case { space: "workgroup" | "storage"; kind: "left" | "right"; major: "row_major" | "col_major"; stride: number; offset: number; mode: "runtime" | "const" | "cross" }

function arg(name: string, dflt: number[]): number[] {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]!.split(",").map(Number) : dflt;
}

let WG_HALVES = 12288; // 24 KiB of f16 (the staged single-buffered 128 x 128 tile's size), less where the device has less
const enables = "enable f16;\nenable chromium_experimental_subgroup_matrix;\ndiagnostic(off, chromium.subgroup_matrix_uniformity);\n";
let SG = 32; // the adapter's subgroup size (fixed on NVIDIA: 32)
let F = 16; // the fragment side: 16 where the adapter has 16 x 16 x 16 (NVIDIA), else 8 (lavapipe, which checks this probe on a CPU)

/** The fragment's element (r, c) is src[offset + r * stride + c] (row_major) or src[offset + c * stride + r]. */
function loadAndReadOut(kind: Case["kind"], major: Case["major"], ptr: string, offset: string, stride: string, out: string): string {
  const loaded = `subgroupMatrixLoad<subgroup_matrix_${kind}<f16, ${F}, ${F}>, ${major}>(${ptr}, ${offset}, ${stride})`;
  // the identity from storage (eye holds a 16 x 16 identity at 0)
  const eye = `subgroupMatrixLoad<subgroup_matrix_${kind === "left" ? "right" : "left"}<f16, ${F}, ${F}>, row_major>(&eye, 0u, 16u)`;
  const zero = `var acc : subgroup_matrix_result<f32, ${F}, ${F}>;`;
  const product = kind === "left" ? `subgroupMatrixMultiplyAccumulate(frag, ${eye}, acc)` : `subgroupMatrixMultiplyAccumulate(${eye}, frag, acc)`;
  return `let frag = ${loaded}; ${zero} let res = ${product}; subgroupMatrixStore<row_major>(&dst, ${out}, res, 16u);`;
}

function shader(c: Case): { code: string; lanes: number } {
  const bindings = `@group(0) @binding(0) var<storage, read> src : array<f16>;
@group(0) @binding(1) var<storage, read> eye : array<f16>;
@group(0) @binding(2) var<storage, read_write> dst : array<f32>;
@group(0) @binding(3) var<uniform> params : vec4<u32>;`;
  if (c.space === "storage") {
    return { lanes: SG, code: `${enables}${bindings}
@compute @workgroup_size(${SG}) fn main() { ${loadAndReadOut(c.kind, c.major, "&src", "params.x", "params.y", "0u")} }` };
  }
  const lanes = c.mode === "cross" ? 4 * SG : SG;
  const [off, str] = c.mode === "const" ? [`${c.offset}u`, `${c.stride}u`] : ["params.x", "params.y"];
  // cross: subgroup s loads the fragment at OFFSET + s * 16 * STRIDE... rotated, so that the rows it reads were written by other lanes' subgroups
  const offsetExpr = c.mode === "cross" ? `${off} + ((sg + 1u) % 4u) * ${F}u * ${str}` : off;
  const outExpr = c.mode === "cross" ? "sg * 256u" : "0u";
  return { lanes, code: `${enables}${bindings}
var<workgroup> wg : array<f16, ${WG_HALVES}>;
@compute @workgroup_size(${lanes}) fn main(@builtin(local_invocation_index) tid : u32) {
  for (var i = tid; i < ${WG_HALVES}u; i = i + ${lanes}u) { wg[i] = src[i]; }
  workgroupBarrier();
  let sg = tid / ${SG}u;
  ${loadAndReadOut(c.kind, c.major, "&wg", offsetExpr, str, outExpr)}
}` };
}

async function main(): Promise<void> {
  await prepareWebGpu();
  console.error(webGpuSummary());
  F = fragmentGeometry().side;
  const gpu = (globalThis as any).navigator.gpu;
  const adapter = await gpu.requestAdapter();
  SG = adapter.info?.subgroupMaxSize ?? 32;
  WG_HALVES = Math.min(WG_HALVES, adapter.limits.maxComputeWorkgroupStorageSize / 2);
  const dev: Dev = await adapter.requestDevice({ requiredLimits: { maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize, maxComputeInvocationsPerWorkgroup: adapter.limits.maxComputeInvocationsPerWorkgroup } });
  console.error(JSON.stringify({ fragment_side: F, subgroup_size: SG, workgroup_storage: adapter.limits.maxComputeWorkgroupStorageSize }));
  const errors: string[] = [];
  dev.onuncapturederror = (e: any) => errors.push(String(e.error?.message ?? e));
  const GPUBufferUsage = (globalThis as any).GPUBufferUsage, GPUMapMode = (globalThis as any).GPUMapMode;
  const srcHalves = new Uint16Array(WG_HALVES).map((_, i) => floatToHalf(value(i)));
  const eyeHalves = new Uint16Array(256).map((_, i) => (i % 17 === 0 ? floatToHalf(1) : 0));
  const buffer = (data: ArrayBufferView, usage: number) => {
    const b = dev.createBuffer({ size: Math.ceil(data.byteLength / 16) * 16, usage: usage | GPUBufferUsage.COPY_DST });
    dev.queue.writeBuffer(b, 0, data.buffer, data.byteOffset, data.byteLength);
    return b;
  };
  const src = buffer(srcHalves, GPUBufferUsage.STORAGE), eye = buffer(eyeHalves, GPUBufferUsage.STORAGE);
  const dst = dev.createBuffer({ size: 4 * 256 * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  const read = dev.createBuffer({ size: 4 * 256 * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const pipelines = new Map<string, any>();

  async function run(c: Case): Promise<{ ok: boolean; bad: number; shift: number | null; first?: string; error?: string }> {
    const { code, lanes } = shader(c);
    let pipe = pipelines.get(code);
    if (!pipe) {
      pipe = await dev.createComputePipelineAsync({ layout: "auto", compute: { module: dev.createShaderModule({ code }), entryPoint: "main" } });
      pipelines.set(code, pipe);
    }
    const params = buffer(new Uint32Array([c.offset, c.stride, 0, 0]), GPUBufferUsage.UNIFORM);
    const group = dev.createBindGroup({ layout: pipe.getBindGroupLayout(0), entries: [src, eye, dst, params].slice(0, code.includes("params.") ? 4 : 3).map((b, i) => ({ binding: i, resource: { buffer: b } })) });
    const enc = dev.createCommandEncoder();
    enc.clearBuffer(dst);
    const pass = enc.beginComputePass();
    pass.setPipeline(pipe); pass.setBindGroup(0, group); pass.dispatchWorkgroups(1); pass.end();
    enc.copyBufferToBuffer(dst, 0, read, 0, 4 * 256 * 4);
    dev.queue.submit([enc.finish()]);
    await read.mapAsync(GPUMapMode.READ);
    const got = new Float32Array(read.getMappedRange().slice(0));
    read.unmap();
    params.destroy();
    const subgroups = lanes / SG;
    let bad = 0, first: string | undefined;
    const shifts = new Set<number>();
    for (let s = 0; s < subgroups; s++) {
      const base = c.mode === "cross" ? c.offset + ((s + 1) % 4) * F * c.stride : c.offset;
      for (let r = 0; r < F; r++) for (let q = 0; q < F; q++) {
        const idx = c.major === "row_major" ? base + r * c.stride + q : base + q * c.stride + r;
        const want = value(idx), g = got[s * 256 + r * 16 + q]!;
        if (g !== want) {
          bad++;
          first ??= `subgroup ${s} (${r},${q}): got ${g}, want ${want} (element ${idx})`;
          shifts.add(Number.isInteger(g) && g >= 0 && g < MOD ? (((g - want) % MOD) + MOD) % MOD : NaN);
        }
      }
    }
    const one = shifts.size === 1 ? [...shifts][0]! : NaN;
    return { ok: bad === 0, bad, shift: bad && Number.isFinite(one) ? (one > MOD / 2 ? one - MOD : one) : null, ...(first ? { first } : {}) };
  }

  const strides = arg("strides", [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 256, 272]);
  const offsets = arg("offsets", [0, 8, 16, 32, 48, 64, 256, 1024, 4096]);
  const failed: string[] = [];
  let total = 0;
  for (const mode of ["runtime", "const", "cross"] as const) {
    for (const space of mode === "runtime" ? (["workgroup", "storage"] as const) : (["workgroup"] as const)) {
      for (const kind of ["left", "right"] as const) for (const major of ["row_major", "col_major"] as const) {
        const rows: string[] = [];
        for (const stride of strides) for (const offset of mode === "runtime" ? offsets : offsets.filter((o) => o % 16 === 0 && o <= 64)) {
          const span = offset + (mode === "cross" ? 4 * F : F) * stride + 16;
          if (span > WG_HALVES || stride < 16) continue;
          const c: Case = { space, kind, major, stride, offset, mode };
          let r: Awaited<ReturnType<typeof run>>;
          try { r = await run(c); } catch (e) { r = { ok: false, bad: -1, shift: null, error: (e as Error).message.slice(0, 200) }; }
          total++;
          if (!r.ok) {
            const name = `${mode}/${space}/${kind}/${major}/stride${stride}/offset${offset}`;
            failed.push(name);
            rows.push(JSON.stringify({ case: name, ...r }));
          }
        }
        console.log(JSON.stringify({ name: "subgroup_load", mode, space, kind, major, failures: rows.length, examples: rows.slice(0, 6).map((s) => JSON.parse(s)) }));
      }
    }
  }
  console.log(JSON.stringify({ name: "subgroup_load_summary", cases: total, failed: failed.length, failed_cases: failed.slice(0, 200), device_errors: errors.slice(0, 5) }));
}

main().catch((e) => { console.error(e); process.exit(1); });
