// The public API of verl-ts. Each layer exports its own surface from its index.
export * from "./engine/backend.js";
export * from "./utils/rng.js";
export * from "./protocol/tensor.js";
export type * from "./models/tokenizer.js";
