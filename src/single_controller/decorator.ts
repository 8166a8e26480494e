// @register({ dispatchMode, executeMode, blocking }): marks a worker method as
// callable from the driver through a WorkerGroup (verl's @register). The
// options are stored on the method function itself, so both a TypeScript 5
// standard decorator and the plain-JS table form (registerMethods) work.
import { Dispatch, Execute, getDispatchMode, type ExecuteMode } from "./dispatch.js";

export interface RegisterOptions {
  /** A built-in Dispatch mode or a name given to registerDispatchMode (default ALL_TO_ALL, as verl). */
  dispatchMode?: string;
  /** ALL (default; RANK_ZERO for Dispatch.RANK_ZERO) or RANK_ZERO. */
  executeMode?: ExecuteMode;
  /** false: the call's failure is held in its future until awaited (no unhandled rejection). Default true. */
  blocking?: boolean;
  /** Await promise/future arguments before dispatching (default true, as verl's materialize_futures). */
  materializeFutures?: boolean;
}

export interface MethodAttrs {
  dispatchMode: string;
  executeMode: ExecuteMode | undefined;
  blocking: boolean;
  materializeFutures: boolean;
}

const REGISTER_ATTR = Symbol.for("verl-ts.single_controller.register");

type Method = (...args: never[]) => unknown;

function attrsFrom(opts: RegisterOptions): MethodAttrs {
  const executeMode = opts.executeMode;
  if (executeMode !== undefined && executeMode !== Execute.ALL && executeMode !== Execute.RANK_ZERO) {
    throw new Error(`register: executeMode must be ${Execute.ALL} or ${Execute.RANK_ZERO}, got '${String(executeMode)}'`);
  }
  return {
    dispatchMode: opts.dispatchMode ?? Dispatch.ALL_TO_ALL,
    executeMode,
    blocking: opts.blocking ?? true,
    materializeFutures: opts.materializeFutures ?? true,
  };
}

function mark(fn: Method, name: string, attrs: MethodAttrs): void {
  if (typeof fn !== "function") throw new Error(`register: '${name}' is not a method`);
  Object.defineProperty(fn, REGISTER_ATTR, { value: attrs, enumerable: false, configurable: true });
}

/** Method decorator: `@register({ dispatchMode: Dispatch.DP_COMPUTE_PROTO }) updateActor(data) {...}`. */
export function register(opts: RegisterOptions = {}) {
  const attrs = attrsFrom(opts);
  return function <T extends Method>(fn: T, context: ClassMethodDecoratorContext): void {
    const name = String(context.name);
    if (context.kind !== "method") throw new Error(`@register applies to methods, not to ${context.kind} '${name}'`);
    if (context.static) throw new Error(`@register: '${name}' is static; register instance methods`);
    if (context.private) throw new Error(`@register: '${name}' is private (#name); a worker group cannot call it`);
    mark(fn, name, attrs);
  };
}

/** The same without decorator syntax: `registerMethods(MyWorker, { updateActor: { dispatchMode: Dispatch.DP_COMPUTE_PROTO } })`. */
export function registerMethods(cls: abstract new (...args: never[]) => unknown, table: Record<string, RegisterOptions>): void {
  const proto = cls.prototype as Record<string, unknown>;
  for (const [name, opts] of Object.entries(table)) {
    const fn = proto[name];
    if (typeof fn !== "function") throw new Error(`registerMethods: ${cls.name} has no method '${name}'`);
    mark(fn as Method, name, attrsFrom(opts));
  }
}

/**
 * The registered methods of a class, nearest definition first (an override
 * without @register is not callable remotely). Checks each dispatch mode exists.
 */
export function registeredMethods(cls: abstract new (...args: never[]) => unknown): Map<string, MethodAttrs> {
  const out = new Map<string, MethodAttrs>();
  const seen = new Set<string>();
  for (let proto = cls.prototype as object | null; proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto) as object | null) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      if (name === "constructor" || seen.has(name)) continue;
      seen.add(name);
      const desc = Object.getOwnPropertyDescriptor(proto, name);
      const fn: unknown = desc?.value;
      if (typeof fn !== "function") continue;
      const attrs = (fn as unknown as Record<symbol, MethodAttrs | undefined>)[REGISTER_ATTR];
      if (!attrs) continue;
      try {
        getDispatchMode(attrs.dispatchMode);
      } catch (e) {
        throw new Error(`${cls.name}.${name}: ${(e as Error).message}`);
      }
      out.set(name, attrs);
    }
  }
  return out;
}

export function executeModeOf(attrs: MethodAttrs): ExecuteMode {
  return attrs.executeMode ?? getDispatchMode(attrs.dispatchMode).defaultExecuteMode ?? Execute.ALL;
}
