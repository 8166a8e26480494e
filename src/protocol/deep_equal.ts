// Structural equality for non-tensor columns and meta info, as verl's union and
// concat compare them: NaN equals NaN, arrays and plain objects compare by
// content, typed arrays by type and values, cycles are tolerated.

export function deepEqual(a: unknown, b: unknown, seen: Set<unknown> = new Set()): boolean {
  if (Object.is(a, b)) return true;
  if (typeof a === "number" && typeof b === "number") return a === b;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
  if (seen.has(a)) return true;
  seen.add(a);
  try {
    if (ArrayBuffer.isView(a)) {
      const x = a as unknown as ArrayLike<number>, y = b as unknown as ArrayLike<number>;
      if (x.length !== y.length) return false;
      for (let i = 0; i < x.length; i++) if (!Object.is(x[i], y[i]) && x[i] !== y[i]) return false;
      return true;
    }
    if (Array.isArray(a)) {
      const y = b as unknown[];
      return a.length === y.length && a.every((v, i) => deepEqual(v, y[i], seen));
    }
    if (a instanceof Date) return a.getTime() === (b as Date).getTime();
    if (a instanceof Map) {
      const y = b as Map<unknown, unknown>;
      if (a.size !== y.size) return false;
      for (const [k, v] of a) if (!y.has(k) || !deepEqual(v, y.get(k), seen)) return false;
      return true;
    }
    const ka = Object.keys(a), kb = Object.keys(b);
    if (ka.length !== kb.length) return false;
    const ob = b as Record<string, unknown>, oa = a as Record<string, unknown>;
    return ka.every((k) => Object.prototype.hasOwnProperty.call(ob, k) && deepEqual(oa[k], ob[k], seen));
  } finally {
    seen.delete(a);
  }
}
