// The tensor type that crosses thread boundaries: a typed array plus a shape.
// The first dimension is the batch. No tfjs here: DataProto must stay cheap to
// move between the driver and the workers (typed arrays move or share).

export type DType = "float32" | "int32" | "bool";
export type TypedArray = Float32Array | Int32Array | Uint8Array;

export interface TensorData {
  data: TypedArray;
  shape: number[];
  dtype: DType;
}

export function arrayFor(dtype: DType, n: number | ArrayBufferLike): TypedArray {
  switch (dtype) {
    case "float32": return typeof n === "number" ? new Float32Array(n) : new Float32Array(n);
    case "int32": return typeof n === "number" ? new Int32Array(n) : new Int32Array(n);
    case "bool": return typeof n === "number" ? new Uint8Array(n) : new Uint8Array(n);
  }
}

export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

export function tensor(data: TypedArray | number[], shape: number[], dtype?: DType): TensorData {
  const dt: DType = dtype ?? (data instanceof Int32Array ? "int32" : data instanceof Uint8Array ? "bool" : "float32");
  const arr = Array.isArray(data) ? (() => { const a = arrayFor(dt, data.length); a.set(data); return a; })() : data;
  if (arr.length !== numel(shape)) {
    throw new Error(`tensor: data has ${arr.length} elements but shape [${shape.join(", ")}] needs ${numel(shape)}`);
  }
  return { data: arr, shape: [...shape], dtype: dt };
}

/** The values as an Int32Array: the tensor's own array when it is one, else a converted copy. */
export function int32Values(t: TensorData): Int32Array {
  return t.data instanceof Int32Array ? t.data : Int32Array.from(t.data);
}

/** Columns [start, start + width) of a row-major [rows, cols] tensor, as a new Int32Array [rows * width]. */
export function int32Columns(t: TensorData, start: number, width: number): Int32Array {
  const [rows, cols] = t.shape as [number, number];
  if (start < 0 || width < 0 || start + width > cols) throw new Error(`int32Columns: columns [${start}, ${start + width}) outside [0, ${cols})`);
  const src = int32Values(t), out = new Int32Array(rows * width);
  for (let r = 0; r < rows; r++) out.set(src.subarray(r * cols + start, r * cols + start + width), r * width);
  return out;
}

/** Row stride: the number of elements per index of the first dimension. */
export function rowSize(t: TensorData): number {
  return numel(t.shape.slice(1));
}
