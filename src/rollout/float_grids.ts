// Rounding to the narrow float formats the quantized rollouts emulate (float8 e4m3fn, float16,
// bfloat16), exactly as the hardware casts round: to nearest, ties to even, saturating. Float32 math
// cannot hold 8-bit floats, so a quantized value is carried as the float32 it stands for.

/** The largest finite float8 e4m3fn value (1.75 * 2^8). */
export const E4M3_MAX = 448;

/** A binary float format by its mantissa bits, least normal exponent and largest finite value. */
interface FloatGrid { mantissa: number; minExp: number; max: number }
const E4M3: FloatGrid = { mantissa: 3, minExp: -6, max: E4M3_MAX };
const F16: FloatGrid = { mantissa: 10, minExp: -14, max: 65504 };
const BF16: FloatGrid = { mantissa: 7, minExp: -126, max: 3.3895313892515355e38 };

/** Round half to even (v >= 0). */
function rint(v: number): number {
  const f = Math.floor(v), d = v - f;
  return d > 0.5 || (d === 0.5 && f % 2 !== 0) ? f + 1 : f;
}

/** 2^e exactly (Math.pow can be off by an ulp for large |e| on some engines). */
function pow2(e: number): number {
  let r = 1;
  if (e >= 0) for (let i = 0; i < e; i++) r *= 2;
  else for (let i = 0; i < -e; i++) r /= 2;
  return r;
}

/** x rounded to the nearest value of `g` (ties to even), subnormals included, saturating at ±max. */
function roundToGrid(x: number, g: FloatGrid): number {
  if (Number.isNaN(x)) return x;
  const a = Math.min(Math.abs(x), g.max);
  if (a === 0) return x; // keeps the sign of -0
  let e = Math.floor(Math.log2(a));
  // log2 can land one off at a power of two: correct it so 2^e <= a < 2^(e+1)
  if (pow2(e) > a) e--;
  else if (pow2(e + 1) <= a) e++;
  const step = pow2(Math.max(e, g.minExp) - g.mantissa); // below the least normal exponent the spacing stays that of subnormals
  const r = Math.min(rint(a / step) * step, g.max); // a / step is exact: step is a power of two
  return x < 0 ? -r : r;
}

/** The float8 e4m3fn value nearest to x (round to nearest even, subnormals down to 2^-9, saturating at ±448 as verl clamps before casting). */
export const roundE4m3 = (x: number): number => roundToGrid(x, E4M3);
/** x as float16 (round to nearest even). */
export const roundF16 = (x: number): number => roundToGrid(x, F16);
/** x as bfloat16 (round to nearest even). */
export const roundBf16 = (x: number): number => roundToGrid(x, BF16);

// Fast paths on float32 bits for the per-weight loops (a 0.5B model has ~360M quantized values a
// sync); the test holds them to roundToGrid on every e4m3 neighbourhood and random values.
const word = new Float32Array(1), bits = new Uint32Array(word.buffer);

/** e4m3 of a float32 value already clamped to ±448: normals round the mantissa to 3 bits (ties to even) on the bits, subnormals to multiples of 2^-9. */
export function roundE4m3Clamped(y: number): number {
  const a = Math.abs(y);
  if (a < 2 ** -6) {
    const r = rint(a * 512) / 512; // exact: scaling by powers of two
    return y < 0 ? -r : r;
  }
  word[0] = y;
  const b = bits[0]!;
  bits[0] = (b + 0x7ffff + ((b >>> 20) & 1)) & 0xfff00000; // round to nearest even at mantissa bit 20
  return word[0];
}

/** bfloat16 of a finite float32 value, on its bits (ties to even). */
export function roundBf16Bits(x: number): number {
  word[0] = x;
  const b = bits[0]!;
  bits[0] = (b + 0x7fff + ((b >>> 16) & 1)) & 0xffff0000;
  return word[0];
}


/** v rounded to the nearest integer, ties to even (torch.round). */
export const roundHalfEven = (v: number): number => (v < 0 ? -rint(-v) : rint(v));
