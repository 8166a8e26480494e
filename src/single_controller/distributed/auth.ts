// Mutual authentication between the hosts of a run, by an HMAC challenge in both
// directions keyed with the run's join token: each side sends a fresh nonce, each
// proves it holds the token by an HMAC-SHA256 over both nonces, its role and the
// run id, and neither ever sends the token itself. Chosen over TLS with a per-run
// CA because every host already shares the token (a Secret, a private file): a CA
// would need a key and certificates made and handed to every host per run, while
// the HMAC needs nothing new and is checked before a byte of the run is sent. It
// authenticates; it does not encrypt (keep the hosts on a private network).
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";

export const NONCE_BYTES = 16;
export const MAC_BYTES = 32;

export type Role = "driver" | "agent" | "ring-server" | "ring-client";

export function freshNonce(): Buffer {
  return randomBytes(NONCE_BYTES);
}

/** HMAC-SHA256(token, role | run id | each part), parts separated so that no two inputs collide. */
export function proof(token: string, role: Role, runId: string, ...parts: (Uint8Array | string | number)[]): Buffer {
  const h = createHmac("sha256", token);
  const field = (b: Uint8Array) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length, 0);
    h.update(len);
    h.update(b);
  };
  field(Buffer.from(role));
  field(Buffer.from(runId));
  for (const p of parts) field(typeof p === "number" ? Buffer.from(String(p)) : typeof p === "string" ? Buffer.from(p) : p);
  return h.digest();
}

/**
 * Constant-time check of a proof a peer sent. Only fixed-size MACs are compared, so
 * the time says nothing about the token or its length; an input of the wrong size is
 * compared against itself (same cost) and fails.
 */
export function proofMatches(given: unknown, expected: Buffer): boolean {
  const g = given instanceof Uint8Array ? Buffer.from(given.buffer, given.byteOffset, given.byteLength) : Buffer.alloc(0);
  const ok = g.length === expected.length;
  const a = ok ? g : expected;
  return timingSafeEqual(a, expected) && ok;
}
