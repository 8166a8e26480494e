// The result of a worker-group call: a Promise (so `await` works) with verl's
// DataProtoFuture `.get()`. A non-blocking call's failure stays inside its
// future until someone awaits it, instead of surfacing as an unhandled rejection.
import { DataProto } from "../protocol/index.js";

export class DataProtoFuture<T = unknown> extends Promise<T> {
  // then/catch/finally return plain Promises, not futures.
  static override get [Symbol.species](): PromiseConstructor {
    return Promise;
  }

  /** Wraps a promise. `held`: swallow the rejection until awaited (non-blocking calls). */
  static from<T>(promise: PromiseLike<T>, held = false): DataProtoFuture<T> {
    const f = new DataProtoFuture<T>((resolve, reject) => {
      promise.then(resolve, reject);
    });
    if (held) f.catch(() => undefined);
    return f;
  }

  /** Waits for the collected result (verl's DataProtoFuture.get). */
  get(): Promise<T> {
    return Promise.resolve().then(() => this);
  }

  /** Concatenates the DataProtos several futures resolve to, in order (verl's DataProtoFuture.concat). */
  static concat(futures: PromiseLike<DataProto>[]): DataProtoFuture<DataProto> {
    return DataProtoFuture.from(Promise.all(futures).then((list) => DataProto.concat(list)), true);
  }
}

export function isThenable(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === "object" || typeof v === "function") && typeof (v as { then?: unknown }).then === "function";
}
