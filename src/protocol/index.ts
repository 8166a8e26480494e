// Public surface of the protocol layer: tensors that cross threads and DataProto.
export * from "./tensor.js";
export {
  DataProto, dataProtoConfig, padDataProtoToDivisor, unpadDataProto, listOfDictToDictOfList,
  type DataProtoItem, type DataProtoPayload, type IndexSpec,
} from "./data_proto.js";
export { deepEqual } from "./deep_equal.js";
export { tensorsEqual } from "./tensor_ops.js";
