// A checker for the tensor-core GEMM kernels (issue 23): it runs the WGSL that the generators in
// src/engine/webgpu_gemm.ts emit (getUserCode(), the very text Dawn compiles) on the CPU, in an
// interpreter for the small WGSL subset those kernels use, so the checks cannot drift from the
// kernels. For every workgroup of a dispatch it
//   - runs each invocation as its own coroutine, all of a workgroup in lock-step between barriers
//     (workgroupBarrier, workgroupUniformLoad); a barrier some invocations miss is an error;
//   - runs subgroup-matrix builtins once per subgroup of 32 lanes (lanes tid / 32), after checking
//     that every lane passed the same arguments (the ops need subgroup-uniform arguments);
//   - checks every storage element index (operand loads, matrix loads/stores) against the bound
//     buffer's length, and every workgroup index against the array length the shader declares;
//     for subgroup-matrix calls also Tint's robustness predicate (offset + (16 - 1) * stride + 16
//     <= length), the check that is compiled out under `disable_robustness`;
//   - checks races on workgroup memory: two accesses to one element between the same pair of
//     barriers by different agents (an invocation, or a subgroup for a matrix op), one a write, is
//     an error; so is a read of workgroup memory no one wrote;
//   - computes the product: operands hold small integers (exact in f16 and in sums), so the
//     result must equal the exact product bit for bit, every padded output element written.
// It is a model of WGSL's semantics, not of the driver: what it proves is that the kernel text is
// in bounds, race-free and right for the shapes run.

/* eslint-disable @typescript-eslint/no-explicit-any */
type Val = any;

// ---- tokens and parse tree ------------------------------------------------------------------

interface Tok { t: "id" | "num" | "op"; v: string }

function tokenize(src: string): Tok[] {
  const out: Tok[] = [];
  const re = /\s+|\/\/[^\n]*|([A-Za-z_][A-Za-z0-9_]*)|(\d+\.\d+|\d+[ui]?)|(<=|>=|==|!=|&&|\|\||[-+*/%<>=&!()[\]{},;:.@])/gy;
  let m: RegExpExecArray | null;
  re.lastIndex = 0;
  while (re.lastIndex < src.length) {
    const at = re.lastIndex;
    m = re.exec(src);
    if (!m || m.index !== at) throw new Error(`wgsl sim: cannot tokenize at ${JSON.stringify(src.slice(at, at + 30))}`);
    if (m[1]) out.push({ t: "id", v: m[1] });
    else if (m[2]) out.push({ t: "num", v: m[2] });
    else if (m[3]) out.push({ t: "op", v: m[3] });
  }
  return out;
}

type Expr =
  | { k: "num"; v: number }
  | { k: "id"; n: string }
  | { k: "bin"; op: string; l: Expr; r: Expr }
  | { k: "un"; op: string; e: Expr }
  | { k: "call"; f: string; targs: string[]; args: Expr[] }
  | { k: "idx"; e: Expr; i: Expr }
  | { k: "mem"; e: Expr; f: string };

type Stmt =
  | { k: "decl"; n: string; mut: boolean; type?: string; init?: Expr }
  | { k: "assign"; lhs: Expr; rhs: Expr }
  | { k: "expr"; e: Expr }
  | { k: "block"; body: Stmt[] }
  | { k: "if"; c: Expr; then: Stmt[]; else?: Stmt[] }
  | { k: "for"; init: Stmt; c: Expr; upd: Stmt; body: Stmt[] };

const TEMPLATED = new Set(["subgroupMatrixLoad", "subgroupMatrixStore", "bitcast", "vec2", "vec3", "vec4", "array"]);
const PREC: Record<string, number> = { "||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, ">": 4, "<=": 4, ">=": 4, "+": 5, "-": 5, "*": 6, "/": 6, "%": 6 };

class Parser {
  p = 0;
  constructor(readonly toks: Tok[]) {}
  peek(o = 0): Tok | undefined { return this.toks[this.p + o]; }
  is(v: string, o = 0): boolean { return this.peek(o)?.v === v; }
  take(v?: string): Tok {
    const t = this.toks[this.p];
    if (!t || (v !== undefined && t.v !== v)) throw new Error(`wgsl sim: expected ${v ?? "a token"} at token ${this.p} (${t?.v ?? "end"}): ${this.toks.slice(Math.max(0, this.p - 8), this.p + 4).map((x) => x.v).join(" ")}`);
    this.p++;
    return t;
  }
  /** a type or template argument, as text (nested <...>) */
  type(): string {
    let s = this.take().v;
    if (this.is("<")) s += this.templateList().map((x) => x).join(",").replace(/^/, "<") + ">";
    return s;
  }
  templateList(): string[] {
    this.take("<");
    const args: string[] = [];
    while (!this.is(">")) {
      args.push(this.type());
      if (this.is(",")) this.take(",");
    }
    this.take(">");
    return args;
  }
  expr(min = 0): Expr {
    let l = this.unary();
    for (;;) {
      const t = this.peek();
      const pr = t && t.t === "op" ? PREC[t.v] : undefined;
      if (pr === undefined || pr < min) return l;
      this.p++;
      const r = this.expr(pr + 1);
      l = { k: "bin", op: t!.v, l, r };
    }
  }
  unary(): Expr {
    if (this.is("&") || this.is("-") || this.is("!")) { const op = this.take().v; return { k: "un", op, e: this.unary() }; }
    return this.postfix(this.primary());
  }
  primary(): Expr {
    const t = this.take();
    if (t.t === "num") return { k: "num", v: Number(t.v.replace(/[ui]$/, "")) };
    if (t.v === "(") { const e = this.expr(); this.take(")"); return e; }
    if (t.t !== "id") throw new Error(`wgsl sim: unexpected '${t.v}'`);
    let targs: string[] = [];
    if (TEMPLATED.has(t.v) && this.is("<")) targs = this.templateList();
    if (this.is("(")) {
      this.take("(");
      const args: Expr[] = [];
      while (!this.is(")")) { args.push(this.expr()); if (this.is(",")) this.take(","); }
      this.take(")");
      return { k: "call", f: t.v, targs, args };
    }
    return { k: "id", n: t.v };
  }
  postfix(e: Expr): Expr {
    for (;;) {
      if (this.is("[")) { this.take("["); const i = this.expr(); this.take("]"); e = { k: "idx", e, i }; }
      else if (this.is(".")) { this.take("."); e = { k: "mem", e, f: this.take().v }; }
      else return e;
    }
  }
  block(): Stmt[] {
    this.take("{");
    const out: Stmt[] = [];
    while (!this.is("}")) out.push(this.stmt());
    this.take("}");
    return out;
  }
  simple(): Stmt {
    if (this.is("let") || this.is("var") || this.is("const")) {
      const mut = this.take().v === "var";
      const n = this.take().v;
      let type: string | undefined, init: Expr | undefined;
      if (this.is(":")) { this.take(":"); type = this.type(); }
      if (this.is("=")) { this.take("="); init = this.expr(); }
      return { k: "decl", n, mut, type, init };
    }
    const e = this.expr();
    if (this.is("=")) { this.take("="); return { k: "assign", lhs: e, rhs: this.expr() }; }
    return { k: "expr", e };
  }
  stmt(): Stmt {
    if (this.is("{")) return { k: "block", body: this.block() };
    if (this.is("if")) {
      this.take("if"); this.take("("); const c = this.expr(); this.take(")");
      const then = this.block();
      let els: Stmt[] | undefined;
      if (this.is("else")) { this.take("else"); els = this.is("if") ? [this.stmt()] : this.block(); }
      return { k: "if", c, then, else: els };
    }
    if (this.is("for")) {
      this.take("for"); this.take("(");
      const init = this.simple(); this.take(";");
      const c = this.expr(); this.take(";");
      const upd = this.simple(); this.take(")");
      return { k: "for", init, c, upd, body: this.block() };
    }
    const s = this.simple();
    this.take(";");
    return s;
  }
}

/** What a kernel's user code declares: workgroup arrays (element counts) and main's body. */
export interface ParsedKernel { workgroup: Map<string, { type: string; length: number }>; body: Stmt[]; f16Bindings: string[] }

export function parseKernel(code: string): ParsedKernel {
  const marker = /\/\/ verl-f16-bindings:([^\n]*)/.exec(code);
  const f16Bindings = marker ? marker[1]!.split(",").map((x) => x.trim()).filter(Boolean) : [];
  const ps = new Parser(tokenize(code));
  const workgroup = new Map<string, { type: string; length: number }>();
  let body: Stmt[] | undefined;
  while (ps.peek()) {
    if (ps.is("enable")) { while (!ps.is(";")) ps.take(); ps.take(";"); continue; }
    if (ps.is("diagnostic")) { while (!ps.is(";")) ps.take(); ps.take(";"); continue; }
    if (ps.is("var")) {
      ps.take("var"); const space = ps.templateList()[0]; const n = ps.take().v; ps.take(":"); const type = ps.type(); ps.take(";");
      if (space !== "workgroup") throw new Error(`wgsl sim: module-scope var<${space}> ${n} is not modelled`);
      const arr = /^array<(\w+),(\d+)>$/.exec(type);
      workgroup.set(n, { type, length: arr ? Number(arr[2]) : 1 });
      continue;
    }
    if (ps.is("fn")) {
      ps.take("fn"); const name = ps.take().v; ps.take("("); ps.take(")");
      if (name !== "main") throw new Error(`wgsl sim: helper function ${name} is not modelled`);
      body = ps.block();
      continue;
    }
    throw new Error(`wgsl sim: unexpected module-scope '${ps.peek()!.v}'`);
  }
  if (!body) throw new Error("wgsl sim: no fn main()");
  return { workgroup, body, f16Bindings };
}

// ---- values and memory ----------------------------------------------------------------------

/** A subgroup matrix value (side x side, row r column c at r * side + c), shared by the lanes of its subgroup. */
class Frag {
  static next = 0;
  readonly id = Frag.next++;
  constructor(readonly role: string, readonly data: Float64Array, readonly side: number) {}
}

/** The side of a square subgroup-matrix type, `subgroup_matrix_left<f16, 16, 16>` -> 16. */
function sideOf(type: string): number {
  const m = /^subgroup_matrix_\w+<\s*\w+\s*,\s*(\d+)\s*,\s*(\d+)\s*>/.exec(type);
  if (!m || m[1] !== m[2]) throw new Error(`wgsl sim: subgroup-matrix type ${type} is not square`);
  return Number(m[1]);
}

interface WgArray { name: string; length: number; data: Val[]; written: Uint8Array; wPhase: Int32Array; wAgent: Int32Array; rPhase: Int32Array; rAgent: Int32Array }

/**
 * A storage buffer's elements (halves of a packed operand, or floats) and the type the shader
 * indexes it as: `words8` (array<vec4<i32>>: 8 halves an element, as 4 words of 2), `words2`
 * (array<i32>: 2 halves), `f16` (array<f16>, the direct kernel's bindings), `vec4f32`, `f32`.
 */
export interface StorageBuf { view: "words8" | "words2" | "f16" | "vec4f32" | "f32"; data: Float64Array }
const PER_ELEMENT: Record<StorageBuf["view"], number> = { words8: 8, words2: 2, f16: 1, vec4f32: 4, f32: 1 };

export interface SimProblem {
  /** the program's dispatch and workgroup size */
  dispatch: [number, number, number]; lanes: number;
  uniforms: Record<string, number>;
  a: StorageBuf; b: StorageBuf; result: StorageBuf;
  /** lanes a subgroup (32 unless given) */
  subgroupSize?: number;
}

export interface SimReport {
  errors: string[];
  /** counts of what was checked */
  stats: { workgroups: number; barriers: number; storageLoads: number; matrixLoads: number; matrixStores: number; wgWrites: number; maxWg: Record<string, number>; maxStorage: Record<string, number> };
}

const MULTI = -2;
const SG_AGENT = 1 << 20;

/** Runs every workgroup of the dispatch; stops collecting after 20 errors. */
export function simulate(code: string, prob: SimProblem): SimReport {
  const k = parseKernel(code);
  const errors: string[] = [];
  const stats: SimReport["stats"] = { workgroups: 0, barriers: 0, storageLoads: 0, matrixLoads: 0, matrixStores: 0, wgWrites: 0, maxWg: {}, maxStorage: {} };
  const err = (m: string) => { if (errors.length < 20) errors.push(m); if (errors.length >= 20) throw new StopSim(); };
  const note = (rec: Record<string, number>, n: string, i: number) => { rec[n] = Math.max(rec[n] ?? -1, i); };
  try {
    for (let z = 0; z < prob.dispatch[2]; z++) for (let y = 0; y < prob.dispatch[1]; y++) for (let x = 0; x < prob.dispatch[0]; x++) {
      runWorkgroup(k, prob, [x, y, z], err, stats, note);
      stats.workgroups++;
    }
  } catch (e) {
    if (!(e instanceof StopSim)) throw e;
  }
  return { errors, stats };
}
class StopSim extends Error {}

function runWorkgroup(k: ParsedKernel, prob: SimProblem, wgId: [number, number, number], err: (m: string) => void, stats: SimReport["stats"],
  note: (rec: Record<string, number>, n: string, i: number) => void): void {
  const where = `workgroup (${wgId.join(",")})`;
  const wg = new Map<string, WgArray>();
  for (const [name, d] of k.workgroup) {
    wg.set(name, { name, length: d.length, data: new Array(d.length), written: new Uint8Array(d.length), wPhase: new Int32Array(d.length).fill(-1), wAgent: new Int32Array(d.length).fill(-1), rPhase: new Int32Array(d.length).fill(-1), rAgent: new Int32Array(d.length).fill(-1) });
  }
  let phase = 0;
  /** subgroup ops of this workgroup: key subgroup#sequence -> the first lane's arguments and result */
  const sgOps = new Map<string, { sig: string; value: Val; seen: number }>();
  const storage: Record<string, StorageBuf> = { a: prob.a, b: prob.b, result: prob.result };

  const wgAccess = (arr: WgArray, i: number, write: boolean, agent: number, what: string) => {
    if (!Number.isInteger(i) || i < 0 || i >= arr.length) { err(`${where}: ${what}: ${arr.name}[${i}] outside array<_, ${arr.length}>`); return false; }
    note(stats.maxWg, arr.name, i);
    if (write) {
      if (arr.wPhase[i] === phase && arr.wAgent[i] !== agent) err(`${where}: race: ${arr.name}[${i}] written by ${agentName(arr.wAgent[i]!)} and ${agentName(agent)} between the same barriers (${what})`);
      if (arr.rPhase[i] === phase && (arr.rAgent[i] === MULTI || arr.rAgent[i] !== agent)) err(`${where}: race: ${arr.name}[${i}] read by ${agentName(arr.rAgent[i]!)} and written by ${agentName(agent)} between the same barriers (${what})`);
      arr.wPhase[i] = phase; arr.wAgent[i] = agent; arr.written[i] = 1;
      stats.wgWrites++;
    } else {
      if (!arr.written[i]) err(`${where}: ${what}: ${arr.name}[${i}] read before any write`);
      if (arr.wPhase[i] === phase && arr.wAgent[i] !== agent) err(`${where}: race: ${arr.name}[${i}] written by ${agentName(arr.wAgent[i]!)} and read by ${agentName(agent)} between the same barriers (${what})`);
      if (arr.rPhase[i] !== phase) { arr.rPhase[i] = phase; arr.rAgent[i] = agent; }
      else if (arr.rAgent[i] !== agent) arr.rAgent[i] = MULTI;
    }
    return true;
  };
  const storageIndex = (name: string, i: number, len: number, what: string) => {
    if (!Number.isInteger(i) || i < 0 || i >= len) { err(`${where}: ${what}: ${name}[${i}] outside the bound buffer (${len} elements)`); return false; }
    note(stats.maxStorage, name, i);
    return true;
  };

  /** elements a 16 x 16 matrix access at offset/stride touches, in (r, c) order */
  const fragIndex = (offset: number, stride: number, colMajor: boolean, r: number, c: number) => (colMajor ? offset + c * stride + r : offset + r * stride + c);

  interface Inv { tid: number; sg: number; seq: number; scope: Scope }
  const lanes = prob.lanes, SG = prob.subgroupSize ?? 32;

  const evalE = (e: Expr, inv: Inv): Val => {
    switch (e.k) {
      case "num": return e.v;
      case "id": return lookup(inv.scope, e.n, inv);
      case "un": {
        if (e.op === "&") { if (e.e.k !== "id") throw new Error("wgsl sim: & of a non-variable"); return { ref: e.e.n }; }
        const v = evalE(e.e, inv);
        return e.op === "-" ? -v : !v;
      }
      case "bin": {
        const l = evalE(e.l, inv), r = evalE(e.r, inv);
        switch (e.op) {
          case "+": return l + r;
          case "-": { const d = l - r; if (d < 0 && Number.isInteger(l) && Number.isInteger(r)) err(`${where}: u32 subtraction ${l} - ${r} wraps`); return d; }
          case "*": return l * r;
          case "/": return Number.isInteger(l) && Number.isInteger(r) ? Math.trunc(l / r) : l / r;
          case "%": return l % r;
          case "<": return l < r; case ">": return l > r; case "<=": return l <= r; case ">=": return l >= r;
          case "==": return l === r; case "!=": return l !== r;
          case "&&": return l && r; case "||": return l || r;
        }
        throw new Error(`wgsl sim: operator ${e.op}`);
      }
      case "mem": {
        const o = evalE(e.e, inv);
        if (Array.isArray(o)) return o["xyzw".indexOf(e.f)];
        if (o && typeof o === "object" && e.f in o) return o[e.f];
        throw new Error(`wgsl sim: member .${e.f}`);
      }
      case "idx": {
        const i = evalE(e.i, inv);
        if (e.e.k === "id" && wg.has(e.e.n)) {
          const arr = wg.get(e.e.n)!;
          return wgAccess(arr, i, false, inv.tid, `load ${e.e.n}[${i}] by invocation ${inv.tid}`) ? (arr.data[i] ?? 0) : 0;
        }
        if (e.e.k === "id" && e.e.n in storage && !inv.scope.has(e.e.n)) return storageLoad(e.e.n, i);
        const o = evalE(e.e, inv);
        return o[i];
      }
      case "call": return call(e, inv);
    }
  };

  const storageLoad = (name: string, i: number): Val => {
    const buf = storage[name]!, per = PER_ELEMENT[buf.view], h = buf.data;
    stats.storageLoads++;
    if (name === "result") throw new Error("wgsl sim: the kernel reads its result");
    const ok = storageIndex(name, i, h.length / per, `${buf.view} load`);
    const at = (j: number) => (ok ? h[per * i + j]! : 0);
    switch (buf.view) {
      case "words8": return [0, 1, 2, 3].map((w) => [at(2 * w), at(2 * w + 1)]);
      case "words2": return [at(0), at(1)];
      case "vec4f32": return [at(0), at(1), at(2), at(3)];
      default: return at(0);
    }
  };

  /** a subgroup-uniform operation: the first lane of the subgroup runs it, the others check their arguments */
  const sgOp = (inv: Inv, sig: string, run: () => Val): Val => {
    const key = `${inv.sg}#${inv.seq++}`;
    const got = sgOps.get(key);
    if (!got) { const value = run(); sgOps.set(key, { sig, value, seen: 1 }); return value; }
    if (got.sig !== sig) err(`${where}: subgroup ${inv.sg}: invocation ${inv.tid} passed ${sig}, its subgroup ${got.sig} (non-uniform subgroup-matrix arguments)`);
    if (++got.seen === Math.min(SG, lanes - inv.sg * SG)) sgOps.delete(key);
    return got.value;
  };

  const call = (e: Extract<Expr, { k: "call" }>, inv: Inv): Val => {
    const args = () => e.args.map((a) => evalE(a, inv));
    switch (e.f) {
      case "u32": case "i32": case "f32": case "f16": return evalE(e.args[0]!, inv);
      case "min": { const [x, y] = args(); return Math.min(x, y); }
      case "max": { const [x, y] = args(); return Math.max(x, y); }
      case "bitcast": {
        if (e.targs[0] !== "vec2<f16>") throw new Error(`wgsl sim: bitcast<${e.targs[0]}>`);
        const w = evalE(e.args[0]!, inv);
        if (w === 0) return [0, 0];
        if (!Array.isArray(w) || w.length !== 2) throw new Error("wgsl sim: bitcast<vec2<f16>> of a value that is not one packed word");
        return w;
      }
      case "vec2": case "vec3": case "vec4": {
        const v = args(), n = Number(e.f[3]);
        if (v.length === 1) return new Array(n).fill(e.targs[0] === "i32" && v[0] === 0 ? [0, 0] : v[0]).map((x) => (Array.isArray(x) ? [...x] : x));
        return v;
      }
      case "subgroupMatrixLoad": {
        const [p, offset, stride] = args();
        const role = e.targs[0]!.replace(/<.*/, ""), colMajor = e.targs[1] === "col_major";
        if (e.targs[1] !== "col_major" && e.targs[1] !== "row_major") throw new Error(`wgsl sim: layout ${e.targs[1]}`);
        return sgOp(inv, `load ${role} ${p.ref} ${offset} ${stride} ${colMajor}`, () => {
          stats.matrixLoads++;
          const n = sideOf(e.targs[0]!), data = new Float64Array(n * n), name: string = p.ref;
          const arr = wg.get(name);
          const len = arr ? arr.length : storage[name]!.data.length;
          if (offset + (n - 1) * stride + n > len) err(`${where}: subgroupMatrixLoad(&${name}, ${offset}, stride ${stride}): Tint's robustness predicate fails (end ${offset + (n - 1) * stride + n} > ${len}): zeros under robustness, out of bounds without`);
          for (let r = 0; r < n; r++) for (let c = 0; c < n; c++) {
            const i = fragIndex(offset, stride, colMajor, r, c);
            if (arr) { if (wgAccess(arr, i, false, SG_AGENT + inv.sg, `subgroupMatrixLoad by subgroup ${inv.sg}`)) data[r * n + c] = arr.data[i] ?? 0; }
            else if (storage[name]!.view !== "f16" || !k.f16Bindings.includes(name)) throw new Error(`wgsl sim: subgroupMatrixLoad from storage ${name} that is not f16`);
            else if (storageIndex(name, i, len, "subgroupMatrixLoad")) data[r * n + c] = storage[name]!.data[i]!;
          }
          return new Frag(role, data, n);
        });
      }
      case "subgroupMatrixStore": {
        const [p, offset, m, stride] = args();
        const colMajor = e.targs[0] === "col_major";
        sgOp(inv, `store ${p.ref} ${offset} ${m.id} ${stride} ${colMajor}`, () => {
          stats.matrixStores++;
          const name: string = p.ref, arr = wg.get(name);
          const len = arr ? arr.length : storage[name]!.data.length;
          const n: number = m.side;
          if (offset + (n - 1) * stride + n > len) err(`${where}: subgroupMatrixStore(&${name}, ${offset}, stride ${stride}): Tint's robustness predicate fails (end ${offset + (n - 1) * stride + n} > ${len})`);
          for (let r = 0; r < n; r++) for (let c = 0; c < n; c++) {
            const i = fragIndex(offset, stride, colMajor, r, c);
            if (arr) { if (wgAccess(arr, i, true, SG_AGENT + inv.sg, `subgroupMatrixStore by subgroup ${inv.sg}`)) arr.data[i] = m.data[r * n + c]; }
            else if (storageIndex(name, i, len, "subgroupMatrixStore")) {
              if (name !== "result") throw new Error(`wgsl sim: store into read-only ${name}`);
              storage[name]!.data[i] = m.data[r * n + c];
            }
          }
          return null;
        });
        return null;
      }
      case "subgroupMatrixMultiplyAccumulate": {
        const [fa, fb, fc] = args();
        return sgOp(inv, `mma ${fa.id} ${fb.id} ${fc.id}`, () => {
          const n: number = fc.side;
          if (fa.side !== n || fb.side !== n) err(`${where}: subgroupMatrixMultiplyAccumulate of sides ${fa.side}, ${fb.side}, ${n}`);
          const out = Float64Array.from(fc.data as Float64Array);
          for (let r = 0; r < n; r++) for (let c = 0; c < n; c++) {
            let s = 0;
            for (let q = 0; q < n; q++) s += fa.data[r * n + q] * fb.data[q * n + c];
            out[r * n + c] += s;
          }
          return new Frag("subgroup_matrix_result", out, n);
        });
      }
    }
    throw new Error(`wgsl sim: builtin ${e.f} is not modelled`);
  };

  function* exec(body: Stmt[], inv: Inv): Generator<"barrier", void, void> {
    for (const s of body) {
      switch (s.k) {
        case "decl": {
          if (s.init && s.init.k === "call" && s.init.f === "workgroupUniformLoad") {
            // a control barrier, then the load
            yield "barrier";
            const ref = evalE(s.init.args[0]!, inv).ref as string, arr = wg.get(ref)!;
            wgAccess(arr, 0, false, inv.tid, `workgroupUniformLoad(&${ref})`);
            inv.scope.set(s.n, arr.data[0]);
            break;
          }
          let v: Val;
          if (s.init) v = evalE(s.init, inv);
          else if (s.type?.startsWith("subgroup_matrix")) v = sgOp(inv, `zero ${s.type}`, () => new Frag(s.type!.replace(/<.*/, ""), new Float64Array(sideOf(s.type!) ** 2), sideOf(s.type!)));
          else if (s.type?.startsWith("array<")) v = [];
          else v = 0;
          inv.scope.set(s.n, v);
          break;
        }
        case "assign": assign(s.lhs, evalE(s.rhs, inv), inv); break;
        case "expr": {
          if (s.e.k === "call" && s.e.f === "workgroupBarrier") { yield "barrier"; break; }
          evalE(s.e, inv);
          break;
        }
        case "block": { const outer = inv.scope; inv.scope = new Scope(outer); yield* exec(s.body, inv); inv.scope = outer; break; }
        case "if": {
          const outer = inv.scope; inv.scope = new Scope(outer);
          if (evalE(s.c, inv)) yield* exec(s.then, inv); else if (s.else) yield* exec(s.else, inv);
          inv.scope = outer;
          break;
        }
        case "for": {
          const outer = inv.scope; inv.scope = new Scope(outer);
          yield* exec([s.init], inv);
          for (let guard = 0; evalE(s.c, inv); guard++) {
            if (guard > 1e6) throw new Error("wgsl sim: runaway loop");
            const o2 = inv.scope; inv.scope = new Scope(o2);
            yield* exec(s.body, inv);
            inv.scope = o2;
            yield* exec([s.upd], inv);
          }
          inv.scope = outer;
          break;
        }
      }
    }
  }

  const assign = (lhs: Expr, v: Val, inv: Inv) => {
    if (lhs.k === "id") {
      const arr = wg.get(lhs.n);
      if (arr && !inv.scope.has(lhs.n)) { if (wgAccess(arr, 0, true, inv.tid, `store ${lhs.n} by invocation ${inv.tid}`)) arr.data[0] = v; return; }
      inv.scope.assign(lhs.n, v);
      return;
    }
    if (lhs.k === "idx" && lhs.e.k === "id") {
      const i = evalE(lhs.i, inv), n = lhs.e.n, arr = wg.get(n);
      if (arr && !inv.scope.has(n)) { if (wgAccess(arr, i, true, inv.tid, `store ${n}[${i}] by invocation ${inv.tid}`)) arr.data[i] = v; return; }
      if (n in storage && !inv.scope.has(n)) {
        const buf = storage[n]!;
        if (n !== "result" || buf.view !== "f32") throw new Error(`wgsl sim: scalar store to storage ${n} is not modelled`);
        if (storageIndex(n, i, buf.data.length, `store by invocation ${inv.tid}`)) buf.data[i] = v;
        return;
      }
      const o = lookup(inv.scope, n, inv);
      o[i] = v;
      return;
    }
    throw new Error("wgsl sim: assignment target not modelled");
  };

  const invs: Inv[] = [], gens: Generator<"barrier", void, void>[] = [];
  for (let tid = 0; tid < lanes; tid++) {
    const inv: Inv = { tid, sg: Math.floor(tid / SG), seq: 0, scope: new Scope(null) };
    invs.push(inv);
    gens.push(exec(k.body, inv));
  }
  const builtins = (inv: Inv): Record<string, Val> => ({ localIndex: inv.tid, workgroupId: wgId, uniforms: prob.uniforms });
  for (const inv of invs) inv.scope.builtins = builtins(inv);
  for (;;) {
    let atBarrier = 0, done = 0;
    for (const g of gens) { if (g.next().done) done++; else atBarrier++; }
    if (atBarrier && done) { err(`${where}: ${done} invocations finished while ${atBarrier} wait at a barrier (a barrier in non-uniform control flow)`); return; }
    if (done) break;
    phase++;
    stats.barriers++;
  }
  if (sgOps.size) err(`${where}: ${sgOps.size} subgroup-matrix operations were not reached by every lane of their subgroup`);
}

class Scope {
  private readonly vars = new Map<string, Val>();
  builtins: Record<string, Val> | null = null;
  constructor(readonly parent: Scope | null) {}
  set(n: string, v: Val) { this.vars.set(n, v); }
  has(n: string): boolean { return this.vars.has(n) || (this.parent?.has(n) ?? false); }
  get(n: string): { found: boolean; v?: Val } {
    for (let s: Scope | null = this; s; s = s.parent) if (s.vars.has(n)) return { found: true, v: s.vars.get(n) };
    return { found: false };
  }
  assign(n: string, v: Val) {
    for (let s: Scope | null = this; s; s = s.parent) if (s.vars.has(n)) { s.vars.set(n, v); return; }
    throw new Error(`wgsl sim: assignment to undeclared ${n}`);
  }
  root(): Scope { let s: Scope = this; while (s.parent) s = s.parent; return s; }
}

function lookup(scope: Scope, n: string, inv: { tid: number }): Val {
  const g = scope.get(n);
  if (g.found) return g.v;
  const b = scope.root().builtins;
  if (b && n in b) return b[n];
  if (["a", "b", "result"].includes(n)) return { ref: n };
  throw new Error(`wgsl sim: unknown identifier ${n} (invocation ${inv.tid})`);
}

function agentName(a: number): string {
  if (a === MULTI) return "several agents";
  return a >= SG_AGENT ? `subgroup ${a - SG_AGENT} (matrix op)` : `invocation ${a}`;
}

// ---- a product to run a padded-operand kernel on ----------------------------------------------

import { GemmProgram, fitTile, operandFormat, type GemmShape, type GemmTile, type OperandFormat, type PaddedGemmKernel } from "../../src/engine/webgpu_gemm.js";
import { fragmentGeometry } from "../../src/engine/subgroup_fragments.js";

/** Small integers from a fixed seed (exact in f16, and so are the products' sums). */
function ints(n: number, seed: number): Float64Array {
  const out = new Float64Array(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) { x = (Math.imul(x, 1664525) + 1013904223) >>> 0; out[i] = ((x >>> 24) % 7) - 3; }
  return out;
}

/** An operand [batch, rows, cols] as PackPadProgram lays it out: [batch, rowsP, colsP] halves, zero-padded. */
function padded(x: Float64Array, batch: number, rows: number, cols: number, rowsP: number, colsP: number): Float64Array {
  const out = new Float64Array(batch * rowsP * colsP);
  for (let b = 0; b < batch; b++) for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[(b * rowsP + r) * colsP + c] = x[(b * rows + r) * cols + c]!;
  return out;
}

export interface KernelRun extends SimReport { mismatches: string[]; unwritten: number; code: string; splits: number }

/**
 * Runs `kernel` on the product `s` in the simulator (operands packed and padded as paddedMatMul
 * packs them, the output buffer sized as the program's outputShape) and compares the [m, n]
 * corner with the exact product; `edit` rewrites the WGSL first (to check the checker).
 */
export function runKernel(kernel: PaddedGemmKernel, s: GemmShape, edit: (code: string) => string = (c) => c): KernelRun {
  const { mP, nP, kP } = kernel.padding(s);
  const prog = kernel.program(s);
  const code = edit(prog.getUserCode());
  const A = ints(s.batchA * s.m * s.k, 1), B = ints(s.batchB * s.k * s.n, 2);
  // logical A[b][i][q], B[b][q][j]; stored transposed where asked
  const aStored = s.transposeA ? transpose(A, s.batchA, s.m, s.k) : A, bStored = s.transposeB ? transpose(B, s.batchB, s.k, s.n) : B;
  const a = s.transposeA ? padded(aStored, s.batchA, s.k, s.m, kP, mP) : padded(aStored, s.batchA, s.m, s.k, mP, kP);
  const b = s.transposeB ? padded(bStored, s.batchB, s.n, s.k, nP, kP) : padded(bStored, s.batchB, s.k, s.n, kP, nP);
  const outLen = prog.outputShape.reduce((x, y) => x * y, 1), splits = kernel.splits?.(s) ?? 1;
  if (outLen !== s.batch * splits * mP * nP) throw new Error(`output shape ${prog.outputShape} is not [batch * splits, mP, nP]`);
  const result = new Float64Array(outLen).fill(NaN);
  const names = [...prog.uniforms!.matchAll(/(\w+)\s*:\s*i32/g)].map((m) => m[1]!);
  const vals = prog.uniformValues();
  const uniforms: Record<string, number> = {};
  names.forEach((n, i) => { uniforms[n] = vals[i]!.data[0] as number; });
  const f16 = /verl-f16-bindings: a,b\n/.test(code);
  const rep = simulate(code, { dispatch: prog.dispatch, lanes: prog.workgroupSize[0] * prog.workgroupSize[1] * prog.workgroupSize[2], uniforms, a: { view: f16 ? "f16" : "words8", data: a }, b: { view: f16 ? "f16" : "words8", data: b }, result: { view: "f32", data: result }, subgroupSize: fragmentGeometry().subgroupSize });
  return { ...rep, ...compare(splits > 1 ? sumParts(result, s.batch, splits, mP * nP) : result, A, B, s, mP, nP), code, splits };
}

/** Split-K parts [batch * splits, plane] summed in order (SplitKSumProgram's sum); NaN where any part is unwritten. */
function sumParts(parts: Float64Array, batch: number, splits: number, plane: number): Float64Array {
  const out = new Float64Array(batch * plane);
  for (let b = 0; b < batch; b++) for (let e = 0; e < plane; e++) {
    let acc = 0;
    for (let p = 0; p < splits; p++) acc += parts[(b * splits + p) * plane + e]!;
    out[b * plane + e] = acc;
  }
  return out;
}

function transpose(x: Float64Array, batch: number, rows: number, cols: number): Float64Array {
  const out = new Float64Array(x.length);
  for (let b = 0; b < batch; b++) for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[(b * cols + c) * rows + r] = x[(b * rows + r) * cols + c]!;
  return out;
}

/**
 * The first staged kernel (GemmProgram: unpadded operands, float32 or packed f16 words, edge tiles
 * through a workgroup scratch), run the same way on the product `s` (f16 rounding).
 */
export function runFirstStaged(tile: GemmTile, s: GemmShape, packed: boolean): KernelRun {
  const t = fitTile(tile, s), fa = operandFormat(s, "a", packed), fb = operandFormat(s, "b", packed);
  const prog = new GemmProgram(s, t, fa, fb, "f16");
  const code = prog.getUserCode();
  const A = ints(s.batchA * s.m * s.k, 1), B = ints(s.batchB * s.k * s.n, 2);
  const a = s.transposeA ? transpose(A, s.batchA, s.m, s.k) : A, b = s.transposeB ? transpose(B, s.batchB, s.k, s.n) : B;
  const view = (f: OperandFormat): StorageBuf["view"] => (f.packed ? (f.width === 8 ? "words8" : "words2") : f.width === 4 ? "vec4f32" : "f32");
  const result = new Float64Array(s.batch * s.m * s.n).fill(NaN);
  const names = [...prog.uniforms.matchAll(/(\w+)\s*:\s*i32/g)].map((m) => m[1]!), vals = prog.uniformValues(), uniforms: Record<string, number> = {};
  names.forEach((n, i) => { uniforms[n] = vals[i]!.data[0] as number; });
  const rep = simulate(code, { dispatch: prog.dispatch, lanes: prog.workgroupSize[0], uniforms, a: { view: view(fa), data: a }, b: { view: view(fb), data: b }, result: { view: "f32", data: result }, subgroupSize: fragmentGeometry().subgroupSize });
  return { ...rep, ...compare(result, A, B, s, s.m, s.n), code, splits: 1 };
}

/** The result [batch, mP, nP] against the exact product in its [m, n] corner (zero elsewhere). */
function compare(result: Float64Array, A: Float64Array, B: Float64Array, s: GemmShape, mP: number, nP: number): { mismatches: string[]; unwritten: number } {
  const mismatches: string[] = [];
  let unwritten = 0;
  for (let bi = 0; bi < s.batch; bi++) for (let i = 0; i < mP; i++) for (let j = 0; j < nP; j++) {
    const got = result[(bi * mP + i) * nP + j]!;
    if (Number.isNaN(got)) { unwritten++; continue; }
    let want = 0;
    if (i < s.m && j < s.n) {
      const ab = s.batchA > 1 ? bi : 0, bb = s.batchB > 1 ? bi : 0;
      for (let q = 0; q < s.k; q++) want += A[(ab * s.m + i) * s.k + q]! * B[(bb * s.k + q) * s.n + j]!;
    }
    if (got !== want && mismatches.length < 5) mismatches.push(`C[${bi}][${i}][${j}] = ${got}, want ${want}`);
  }
  return { mismatches, unwritten };
}
