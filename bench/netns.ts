// Two "hosts" for the tests and benchmarks: Linux network namespaces joined by a veth pair,
// 10.231.0.1 and 10.231.0.2 (addresses that exist only inside these two
// namespaces; nothing leaves them). Needs root and iproute2; `available()`
// says why not otherwise, and the tests and benchmarks skip with that reason.
import { spawnSync } from "node:child_process";

export interface NetnsPair {
  names: [string, string];
  addrs: [string, string];
  remove(): void;
}

function ip(args: string[]): { ok: boolean; err: string } {
  const r = spawnSync("ip", args, { encoding: "utf8" });
  if (r.error) return { ok: false, err: r.error.message };
  return { ok: r.status === 0, err: (r.stderr || r.stdout || "").trim() };
}

/** Makes the pair, or returns the reason it cannot be made here. */
export function createNetnsPair(tag = String(process.pid % 100000)): NetnsPair | string {
  if (process.platform !== "linux") return "network namespaces need Linux";
  if (process.getuid?.() !== 0) return "creating network namespaces needs root";
  const names: [string, string] = [`vts-a-${tag}`, `vts-b-${tag}`];
  const links = [`vtsa${tag}`, `vtsb${tag}`];
  const addrs: [string, string] = ["10.231.0.1", "10.231.0.2"];
  const remove = () => {
    for (const n of names) ip(["netns", "del", n]);
  };
  const steps: string[][] = [
    ["netns", "add", names[0]], ["netns", "add", names[1]],
    ["link", "add", links[0]!, "type", "veth", "peer", "name", links[1]!],
    ["link", "set", links[0]!, "netns", names[0]], ["link", "set", links[1]!, "netns", names[1]],
    ["-n", names[0], "addr", "add", `${addrs[0]}/24`, "dev", links[0]!], ["-n", names[1], "addr", "add", `${addrs[1]}/24`, "dev", links[1]!],
    ["-n", names[0], "link", "set", "lo", "up"], ["-n", names[1], "link", "set", "lo", "up"],
    ["-n", names[0], "link", "set", links[0]!, "up"], ["-n", names[1], "link", "set", links[1]!, "up"],
  ];
  for (const s of steps) {
    const r = ip(s);
    if (!r.ok) {
      remove();
      ip(["link", "del", links[0]!]);
      return `'ip ${s.join(" ")}' failed: ${r.err || "no output"}${/ENOENT/.test(r.err) ? " (install iproute2)" : ""}`;
    }
  }
  return { names, addrs, remove };
}
