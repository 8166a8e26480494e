// Where a host listens and dials, as a cluster needs it: the interface named by
// VERL_SOCKET_IFNAME (as NCCL_SOCKET_IFNAME: a name, a prefix, or ^names to
// exclude, comma-separated), ring ports from VERL_RING_PORT_RANGE (LO-HI),
// and lookups retried until a deadline (a pod's DNS record appears after the pod).
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { networkInterfaces } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

export const isIp = (s: string): boolean => isIP(s) !== 0;

/** Whether an interface name passes a NCCL_SOCKET_IFNAME-style filter. */
export function interfaceMatches(name: string, filter: string): boolean {
  const exclude = filter.startsWith("^");
  const parts = (exclude ? filter.slice(1) : filter).split(",").map((p) => p.trim()).filter(Boolean);
  const exact = (p: string) => p.startsWith("=");
  const hit = parts.some((p) => (exact(p) ? name === p.slice(1) : name.startsWith(p)));
  return exclude ? !hit : hit;
}

/**
 * The IPv4 address (else IPv6) of the first interface that passes `filter`
 * (VERL_SOCKET_IFNAME); without a filter, the first non-internal interface.
 * undefined when none matches.
 */
export function interfaceAddress(filter: string | undefined, ifaces = networkInterfaces()): string | undefined {
  const names = Object.keys(ifaces).filter((n) => (filter ? interfaceMatches(n, filter) : true)).sort();
  for (const family of ["IPv4", "IPv6"]) {
    for (const n of names) {
      for (const a of ifaces[n] ?? []) {
        if (a.family !== family || (!filter && a.internal)) continue;
        if (family === "IPv6" && a.address.startsWith("fe80")) continue;
        return a.address;
      }
    }
  }
  return undefined;
}

/** VERL_SOCKET_IFNAME's address, or a clear error naming the interfaces there are. */
export function socketIfnameAddress(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const f = env.VERL_SOCKET_IFNAME;
  if (!f) return undefined;
  const a = interfaceAddress(f);
  if (!a) throw new Error(`VERL_SOCKET_IFNAME='${f}' matches no interface with an address here (interfaces: ${Object.keys(networkInterfaces()).join(", ")})`);
  return a;
}

/** Resolves a host name, retrying until `deadlineMs` passes (DNS records of pods appear late). */
export async function lookupWithRetry(name: string, deadlineMs: number): Promise<string> {
  const until = Date.now() + deadlineMs;
  let wait = 200;
  for (;;) {
    try {
      return (await lookup(name)).address;
    } catch (e) {
      if (Date.now() + wait > until) throw new Error(`cannot resolve '${name}' within ${deadlineMs / 1000} s (VERL_DNS_TIMEOUT_S): ${(e as Error).message}`);
      await sleep(wait);
      wait = Math.min(wait * 2, 5000);
    }
  }
}

/** VERL_RING_PORT_RANGE 'LO-HI' (undefined: any free port). */
export function ringPortRange(env: NodeJS.ProcessEnv = process.env): [number, number] | undefined {
  const raw = env.VERL_RING_PORT_RANGE;
  if (raw === undefined || raw === "") return undefined;
  const m = /^(\d+)-(\d+)$/.exec(raw.trim());
  const lo = m ? Number(m[1]) : NaN, hi = m ? Number(m[2]) : NaN;
  if (!m || !(lo >= 1 && lo <= hi && hi <= 65535)) throw new Error(`VERL_RING_PORT_RANGE='${raw}' must be LO-HI with 1 <= LO <= HI <= 65535`);
  return [lo, hi];
}

/** Tries each port of the range in turn with `listen`; the first that binds wins. */
export async function listenInRange<T>(range: [number, number] | undefined, listen: (port: number) => Promise<T>): Promise<T> {
  if (!range) return listen(0);
  let last: Error | undefined;
  for (let p = range[0]; p <= range[1]; p++) {
    try {
      return await listen(p);
    } catch (e) {
      last = e as Error;
    }
  }
  throw new Error(`no free port in VERL_RING_PORT_RANGE ${range[0]}-${range[1]}: ${last?.message ?? "empty range"}`);
}
