// Public surface of the single controller: resource pools of rank threads,
// worker classes with registered methods, worker groups that dispatch calls,
// colocated roles, and collectives among the ranks.
export { Dispatch, Execute, registerDispatchMode, updateDispatchMode, getDispatchMode, listDispatchModes } from "./dispatch.js";
export type { ExecuteMode, WorkerGroupInfo, DispatchFn, CollectFn, DispatchResult, DispatchModeSpec } from "./dispatch.js";
export { register, registerMethods, registeredMethods } from "./decorator.js";
export type { RegisterOptions, MethodAttrs } from "./decorator.js";
export { Worker, onThreadClose } from "./worker.js";
export { ClassWithInitArgs, FunctionRef, ColocatedWorkerClass, createColocatedWorkerClass } from "./class_with_init_args.js";
export { ResourcePool, poolSizeFromConfig, poolShapeFromConfig, DEFAULT_HEARTBEAT_TIMEOUT_MS, DEFAULT_RANK_HEAP_LIMIT_MB, rankHeapLimitFromConfig } from "./resource_pool.js";
export type { ResourcePoolOptions, RankBackend, RemoteRanks, CollectiveControl } from "./resource_pool.js";
export { WorkerGroup } from "./worker_group.js";
export type { BoundWorkerGroup, RemoteMethod } from "./worker_group.js";
export { DataProtoFuture } from "./future.js";
export { Collective, DEFAULT_COLLECTIVE_TIMEOUT_MS } from "./collective.js";
export type { ReduceOp, CollectiveOptions, RankCollective } from "./collective.js";
export { WorkerError, WorkerDiedError, WorkerUnresponsiveError, CollectiveError, WorkerGroupClosedError } from "./errors.js";
export { heartbeat, insideNativeCall } from "./heartbeat.js";
export type { RemoteErrorInfo } from "./errors.js";
