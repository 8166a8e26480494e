// Work tied to a backend data object's lifetime: packed copies of an operand (PackedWeightCache),
// a frozen stack's packed words (frozen_weights.ts). tfjs gives no release event, so the backend's
// disposeData is wrapped once and tells every listener which data it freed (its last reference gone).

interface Disposer { disposeData(id: object, force?: boolean): boolean }

const listeners = new WeakMap<object, ((id: object) => void)[]>();

/** Calls `listener` with each data object `backend` releases from now on. */
export function onDataReleased(backend: Disposer, listener: (id: object) => void): void {
  let ls = listeners.get(backend);
  if (!ls) {
    const all: ((id: object) => void)[] = (ls = []);
    listeners.set(backend, all);
    const dispose = backend.disposeData.bind(backend);
    backend.disposeData = (id: object, force?: boolean): boolean => {
      const gone = dispose(id, force);
      if (gone) for (const l of all) l(id);
      return gone;
    };
  }
  ls.push(listener);
}

const once = new WeakMap<object, (() => void)[]>();
const watched = new WeakSet<object>();

/** Runs `fn` once `backend` releases `dataId`. */
export function onRelease(backend: Disposer, dataId: object, fn: () => void): void {
  if (!watched.has(backend)) {
    watched.add(backend);
    onDataReleased(backend, (id) => {
      const fns = once.get(id);
      if (fns) { once.delete(id); for (const f of fns) f(); }
    });
  }
  const fns = once.get(dataId);
  if (fns) fns.push(fn); else once.set(dataId, [fn]);
}
