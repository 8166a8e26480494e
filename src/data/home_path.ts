// verl configs write data paths as ~/data/...; expand the home directory as Python's os.path.expanduser does.
import { homedir } from "node:os";
import { join, resolve } from "node:path";

export function expandHome(p: string): string {
  return resolve(p === "~" ? homedir() : p.startsWith("~/") ? join(homedir(), p.slice(2)) : p);
}
