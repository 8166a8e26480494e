// Seeded random numbers. Everything random in the project (sampling, shuffles,
// init) draws from these so that the same seed gives the same run. The state is
// four 32-bit words (xoshiro128**), small enough to save in checkpoints.

export interface RngState { s: [number, number, number, number] }

function splitmix32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x9e3779b9) >>> 0;
    let z = a;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
}

export class Rng {
  private s: Uint32Array;

  constructor(seed: number | RngState = 0) {
    this.s = new Uint32Array(4);
    if (typeof seed === "number") {
      const sm = splitmix32(seed);
      for (let i = 0; i < 4; i++) this.s[i] = sm();
      if (this.s.every((v) => v === 0)) this.s[0] = 1;
    } else {
      this.s.set(seed.s);
    }
  }

  /** A uniform 32-bit unsigned integer. */
  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2]! ^= s[0]!;
    s[3]! ^= s[1]!;
    s[1]! ^= s[2]!;
    s[0]! ^= s[3]!;
    s[2]! ^= t;
    s[3] = rotl(s[3]!, 11);
    return result;
  }

  /** A uniform float in [0, 1) with 32 bits of randomness. */
  random(): number {
    return this.nextU32() / 4294967296;
  }

  /** A uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.random() * n);
  }

  /** A standard normal sample (Box-Muller). */
  normal(): number {
    let u = 0;
    while (u === 0) u = this.random();
    const v = this.random();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }

  /** Fisher-Yates permutation of 0..n-1. */
  permutation(n: number): number[] {
    const p = Array.from({ length: n }, (_, i) => i);
    for (let i = n - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [p[i], p[j]] = [p[j]!, p[i]!];
    }
    return p;
  }

  /** A new independent stream derived from this one. */
  fork(): Rng {
    return new Rng(this.nextU32());
  }

  getState(): RngState {
    return { s: [this.s[0]!, this.s[1]!, this.s[2]!, this.s[3]!] };
  }

  setState(state: RngState): void {
    this.s.set(state.s);
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}
