// A restricted unpickler: Python's pickle protocols 2 to 5 (the binary opcodes; what torch.save and
// torch.distributed.checkpoint write), decoding data and nothing else. A pickle names classes and
// functions by module and name (GLOBAL / STACK_GLOBAL); each is looked up in the caller's table of
// allowed names (`PickleHooks.global`), which maps it to a plain value or to a JS function building
// a plain value from its arguments. Nothing named by the file is ever executed, and any name not in
// the table is refused with an error naming it and the file.
//
// Python values come back as: None -> null, bool, int -> number (bigint past 2^53), float -> number,
// str -> string, bytes -> Uint8Array, list -> array, tuple -> frozen array (isTuple), dict -> Map
// (insertion order kept; keys by value for str / int / bool / None, by identity otherwise),
// set / frozenset -> Set, an instance of an allowed class -> whatever its table entry builds.
import type { ByteSource } from "./zip.js";

/** A callable a pickle may name (a class or a function): REDUCE / NEWOBJ pass it the arguments. */
export class PyCallable {
  constructor(readonly qualname: string, readonly call: (args: readonly unknown[], kwargs?: Map<unknown, unknown>) => unknown) {}
}

/** An instance of an allowed class rebuilt field by field (dataclasses, enums): class name, constructor args, then BUILD's state. */
export class PyObject {
  /** Attributes from BUILD's dict state (and slot state). */
  readonly attrs: Record<string, unknown> = {};
  /** A BUILD state that is not a dict (what the class's __getstate__ returned), else undefined. */
  state: unknown;
  constructor(readonly cls: string, readonly args: readonly unknown[]) {}
}

export interface PickleHooks {
  /** The value `module.name` stands for; throw to refuse it. */
  global(module: string, name: string): unknown;
  /** BINPERSID: the object a persistent id names (torch's storages). */
  persistentLoad?(pid: unknown): unknown;
  /** BUILD on a value that is neither a PyObject nor a dict: return true when handled. */
  build?(target: unknown, state: unknown): boolean;
}

/** Whether a value is a Python tuple (a frozen array). */
export function isTuple(v: unknown): v is readonly unknown[] {
  return Array.isArray(v) && Object.isFrozen(v);
}

const tuple = (items: unknown[]): readonly unknown[] => Object.freeze(items);

/** A forward reader over a ByteSource, buffered by window, tracking its absolute position. */
export class StreamReader {
  private buf: Uint8Array = new Uint8Array(0);
  private bufAt = 0;
  constructor(readonly src: ByteSource, public pos = 0, private readonly window = 1 << 20) {}

  bytes(n: number): Uint8Array {
    if (this.pos + n > this.src.size) throw new Error(`${this.src.name}: pickle runs past the end of the data (at byte ${this.pos}, wanted ${n} more)`);
    if (this.pos < this.bufAt || this.pos + n > this.bufAt + this.buf.byteLength) {
      if (n > this.window) { const out = this.src.read(this.pos, n); this.pos += n; return out; }
      this.bufAt = this.pos;
      this.buf = this.src.read(this.pos, Math.min(this.window, this.src.size - this.pos));
    }
    const at = this.pos - this.bufAt;
    this.pos += n;
    return this.buf.subarray(at, at + n);
  }

  byte(): number {
    return this.bytes(1)[0]!;
  }
}

const MARK = Symbol("mark");
const dec = new TextDecoder("utf-8", { fatal: true });
const latin1 = new TextDecoder("latin1");

function le(b: Uint8Array): DataView {
  return new DataView(b.buffer, b.byteOffset, b.byteLength);
}

/** Python's two's-complement little-endian long (LONG1 / LONG4) -> number, or bigint past 2^53. */
function decodeLong(b: Uint8Array): number | bigint {
  if (b.byteLength === 0) return 0;
  let v = 0n;
  for (let i = b.byteLength - 1; i >= 0; i--) v = (v << 8n) | BigInt(b[i]!);
  if (b[b.byteLength - 1]! & 0x80) v -= 1n << BigInt(8 * b.byteLength);
  return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
}

const OPNAMES: Record<number, string> = {
  0x49: "INT", 0x4c: "LONG", 0x46: "FLOAT", 0x53: "STRING", 0x56: "UNICODE", 0x70: "PUT", 0x67: "GET", 0x50: "PERSID",
  0x69: "INST", 0x6f: "OBJ", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
};

/**
 * Unpickle one pickle from `r` (which is left just past its STOP). `file` names the source in errors.
 */
export function unpickle(r: StreamReader, hooks: PickleHooks, file: string): unknown {
  const stack: unknown[] = [];
  const marks: number[] = [];
  const memo = new Map<number, unknown>();
  const fail = (msg: string): never => { throw new Error(`${file}: ${msg}`); };
  const pop = (): unknown => (stack.length === 0 ? fail("corrupt pickle (stack underflow)") : stack.pop());
  const top = (): unknown => (stack.length === 0 ? fail("corrupt pickle (empty stack)") : stack[stack.length - 1]);
  const popMark = (): unknown[] => {
    const m = marks.pop();
    if (m === undefined) fail("corrupt pickle (no MARK)");
    return stack.splice(m!);
  };
  const callable = (f: unknown, op: string): PyCallable => (f instanceof PyCallable ? f : fail(`corrupt pickle (${op} on something that is not a class or function)`));
  const setItems = (d: unknown, kv: unknown[]) => {
    if (!(d instanceof Map)) fail("corrupt pickle (SETITEM on something that is not a dict)");
    for (let i = 0; i + 1 < kv.length; i += 2) (d as Map<unknown, unknown>).set(kv[i], kv[i + 1]);
  };
  const append = (l: unknown, items: unknown[]) => {
    if (!Array.isArray(l) || Object.isFrozen(l)) fail("corrupt pickle (APPEND on something that is not a list)");
    (l as unknown[]).push(...items);
  };
  const str = (n: number) => {
    try { return dec.decode(r.bytes(n)); } catch (e) { return fail(`bad UTF-8 string in pickle (${(e as Error).message})`); }
  };
  const size = (b: Uint8Array, what: string): number => {
    const v = le(b).getBigUint64(0, true);
    return v > BigInt(Number.MAX_SAFE_INTEGER) ? fail(`${what} of ${v} bytes`) : Number(v);
  };

  for (;;) {
    const at = r.pos, op = r.byte();
    switch (op) {
      case 0x80: { // PROTO
        const p = r.byte();
        if (p < 2 || p > 5) fail(`pickle protocol ${p}; protocols 2 to 5 are read`);
        break;
      }
      case 0x95: r.bytes(8); break; // FRAME: a length hint only
      case 0x2e: { // STOP
        const v = pop();
        return v;
      }
      case 0x28: marks.push(stack.length); break; // MARK
      case 0x30: pop(); break; // POP
      case 0x31: popMark(); break; // POP_MARK
      case 0x32: stack.push(top()); break; // DUP
      case 0x4e: stack.push(null); break; // NONE
      case 0x88: stack.push(true); break; // NEWTRUE
      case 0x89: stack.push(false); break; // NEWFALSE
      case 0x4a: stack.push(le(r.bytes(4)).getInt32(0, true)); break; // BININT
      case 0x4b: stack.push(r.byte()); break; // BININT1
      case 0x4d: stack.push(le(r.bytes(2)).getUint16(0, true)); break; // BININT2
      case 0x8a: stack.push(decodeLong(r.bytes(r.byte()))); break; // LONG1
      case 0x8b: stack.push(decodeLong(r.bytes(le(r.bytes(4)).getInt32(0, true)))); break; // LONG4
      case 0x47: stack.push(le(r.bytes(8)).getFloat64(0, false)); break; // BINFLOAT (big-endian)
      case 0x58: stack.push(str(le(r.bytes(4)).getUint32(0, true))); break; // BINUNICODE
      case 0x8c: stack.push(str(r.byte())); break; // SHORT_BINUNICODE
      case 0x8d: stack.push(str(size(r.bytes(8), "a string"))); break; // BINUNICODE8
      case 0x54: stack.push(latin1.decode(r.bytes(le(r.bytes(4)).getInt32(0, true)))); break; // BINSTRING (Python 2 str)
      case 0x55: stack.push(latin1.decode(r.bytes(r.byte()))); break; // SHORT_BINSTRING
      case 0x42: stack.push(r.bytes(le(r.bytes(4)).getUint32(0, true)).slice()); break; // BINBYTES
      case 0x43: stack.push(r.bytes(r.byte()).slice()); break; // SHORT_BINBYTES
      case 0x8e: case 0x96: stack.push(r.bytes(size(r.bytes(8), "a bytes object")).slice()); break; // BINBYTES8, BYTEARRAY8
      case 0x29: stack.push(tuple([])); break; // EMPTY_TUPLE
      case 0x74: stack.push(tuple(popMark())); break; // TUPLE
      case 0x85: stack.push(tuple([pop()])); break; // TUPLE1
      case 0x86: { const b = pop(), a = pop(); stack.push(tuple([a, b])); break; } // TUPLE2
      case 0x87: { const c = pop(), b = pop(), a = pop(); stack.push(tuple([a, b, c])); break; } // TUPLE3
      case 0x5d: stack.push([]); break; // EMPTY_LIST
      case 0x6c: stack.push(popMark()); break; // LIST
      case 0x61: { const v = pop(); append(top(), [v]); break; } // APPEND
      case 0x65: { const items = popMark(); append(top(), items); break; } // APPENDS
      case 0x7d: stack.push(new Map()); break; // EMPTY_DICT
      case 0x64: { const d = new Map(); setItems(d, popMark()); stack.push(d); break; } // DICT
      case 0x73: { const v = pop(), k = pop(); setItems(top(), [k, v]); break; } // SETITEM
      case 0x75: { const kv = popMark(); setItems(top(), kv); break; } // SETITEMS
      case 0x8f: stack.push(new Set()); break; // EMPTY_SET
      case 0x90: { // ADDITEMS
        const items = popMark(), s = top();
        if (!(s instanceof Set)) fail("corrupt pickle (ADDITEMS on something that is not a set)");
        for (const v of items) (s as Set<unknown>).add(v);
        break;
      }
      case 0x91: stack.push(new Set(popMark())); break; // FROZENSET
      case 0x63: { // GLOBAL: "module\nname\n"
        const line = () => { let s = ""; for (let c = r.byte(); c !== 0x0a; c = r.byte()) s += String.fromCharCode(c); return s; };
        const mod = line(), name = line();
        stack.push(hooks.global(mod, name));
        break;
      }
      case 0x93: { // STACK_GLOBAL
        const name = pop(), mod = pop();
        if (typeof mod !== "string" || typeof name !== "string") fail("corrupt pickle (STACK_GLOBAL without two strings)");
        stack.push(hooks.global(mod as string, name as string));
        break;
      }
      case 0x52: { // REDUCE
        const args = pop(), f = callable(pop(), "REDUCE");
        if (!Array.isArray(args)) fail(`corrupt pickle (${f.qualname} called without an argument tuple)`);
        stack.push(f.call(args as unknown[]));
        break;
      }
      case 0x81: { // NEWOBJ: cls.__new__(cls, *args)
        const args = pop(), f = callable(pop(), "NEWOBJ");
        stack.push(f.call(args as unknown[]));
        break;
      }
      case 0x92: { // NEWOBJ_EX
        const kwargs = pop(), args = pop(), f = callable(pop(), "NEWOBJ_EX");
        stack.push(f.call(args as unknown[], kwargs as Map<unknown, unknown>));
        break;
      }
      case 0x62: { // BUILD
        const state = pop(), target = top();
        if (target instanceof PyObject) {
          // (dict state, slot state) or a dict or whatever __getstate__ returned
          const parts = isTuple(state) && state.length === 2 && (state[0] === null || state[0] instanceof Map) && (state[1] === null || state[1] instanceof Map) ? state : [state];
          let plain = true;
          for (const s of parts) {
            if (s instanceof Map) { for (const [k, v] of s) target.attrs[String(k)] = v; } else if (s !== null) plain = false;
          }
          if (!plain) target.state = state;
        } else if (target instanceof Map) {
          // a dict subclass's instance attributes (an OrderedDict state_dict's _metadata): not data
        } else if (!hooks.build?.(target, state)) {
          fail(`corrupt or unsupported pickle (BUILD on ${Object.prototype.toString.call(target)})`);
        }
        break;
      }
      case 0x51: { // BINPERSID
        const pid = pop();
        if (!hooks.persistentLoad) fail("the pickle refers to persistent objects, which this file type cannot hold");
        stack.push(hooks.persistentLoad!(pid));
        break;
      }
      case 0x71: memo.set(r.byte(), top()); break; // BINPUT
      case 0x72: memo.set(le(r.bytes(4)).getUint32(0, true), top()); break; // LONG_BINPUT
      case 0x94: memo.set(memo.size, top()); break; // MEMOIZE
      case 0x68: case 0x6a: { // BINGET, LONG_BINGET
        const i = op === 0x68 ? r.byte() : le(r.bytes(4)).getUint32(0, true);
        if (!memo.has(i)) fail(`corrupt pickle (memo ${i} read before it is written)`);
        stack.push(memo.get(i));
        break;
      }
      default: {
        const name = OPNAMES[op];
        fail(name
          ? `pickle opcode ${name} at byte ${at} is not read (protocol 0/1 text opcodes, extension registry and out-of-band buffers are not used by torch.save)`
          : `not a pickle, or a corrupt one (byte 0x${op.toString(16)} at ${at} is no pickle opcode)`);
      }
    }
  }
}
