// References to code that a worker thread must load itself: a worker class (by
// module URL and export name, with its constructor arguments), a function, or
// several worker classes colocated in the same threads. Functions and classes
// cannot be posted to a thread, so the thread imports them by name.
import { isAbsolute } from "node:path";
import { pathToFileURL } from "node:url";

/** A file URL (string or URL) or an absolute path, as a file URL string. */
export function toModuleUrl(moduleUrl: string | URL, what: string): string {
  if (moduleUrl instanceof URL) return moduleUrl.href;
  if (typeof moduleUrl !== "string" || moduleUrl.length === 0) throw new Error(`${what}: moduleUrl must be a file URL or an absolute path`);
  if (/^[a-z][a-z0-9+.-]*:/i.test(moduleUrl) && !/^[a-z]:[\\/]/i.test(moduleUrl)) return moduleUrl;
  if (!isAbsolute(moduleUrl)) {
    throw new Error(`${what}: '${moduleUrl}' is relative; pass import.meta.url, new URL('./mod.js', import.meta.url) or an absolute path`);
  }
  return pathToFileURL(moduleUrl).href;
}

function checkExportName(exportName: string, what: string): void {
  if (typeof exportName !== "string" || exportName.length === 0) throw new Error(`${what}: exportName must be a non-empty string`);
}

/** A worker class to construct in every rank's thread: `new (await import(moduleUrl))[exportName](...initArgs)` (verl's RayClassWithInitArgs). */
export class ClassWithInitArgs {
  readonly moduleUrl: string;
  readonly initArgs: unknown[];
  constructor(moduleUrl: string | URL, readonly exportName: string, ...initArgs: unknown[]) {
    this.moduleUrl = toModuleUrl(moduleUrl, `ClassWithInitArgs(${String(exportName)})`);
    checkExportName(exportName, "ClassWithInitArgs");
    this.initArgs = initArgs;
  }
}

/** A function a worker imports by module and name (for DP_COMPUTE_PROTO_WITH_FUNC or any argument). */
export class FunctionRef {
  readonly moduleUrl: string;
  constructor(moduleUrl: string | URL, readonly exportName: string) {
    this.moduleUrl = toModuleUrl(moduleUrl, `FunctionRef(${String(exportName)})`);
    checkExportName(exportName, "FunctionRef");
  }
}

/** Several roles sharing the same threads (verl's create_colocated_worker_cls): one instance per role in every rank. */
export class ColocatedWorkerClass {
  readonly roles: Readonly<Record<string, ClassWithInitArgs>>;
  constructor(roles: Record<string, ClassWithInitArgs>) {
    const names = Object.keys(roles);
    if (names.length === 0) throw new Error("createColocatedWorkerClass: give at least one role");
    for (const name of names) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new Error(`createColocatedWorkerClass: role name '${name}' must be an identifier`);
      if (!(roles[name] instanceof ClassWithInitArgs)) throw new Error(`createColocatedWorkerClass: role '${name}' must be a ClassWithInitArgs`);
    }
    this.roles = Object.freeze({ ...roles });
  }
}

export function createColocatedWorkerClass(roles: Record<string, ClassWithInitArgs>): ColocatedWorkerClass {
  return new ColocatedWorkerClass(roles);
}
