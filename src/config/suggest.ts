// "Did you mean ...?" for unknown keys: edit distance over the full dotted path
// and over the last segment, so both typos (optim.lrr) and a missing prefix
// (actor.optim.lr for actor_rollout_ref.actor.optim.lr) find their key.
import { getPath, isNode, listPaths, splitPath, type ConfigNode } from "./tree.js";

export function editDistance(a: string, b: string): number {
  if (a === b) return 0;
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      const sub = prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1);
      cur.push(Math.min(prev[j]! + 1, cur[j - 1]! + 1, sub));
    }
    prev = cur;
  }
  return prev[b.length]!;
}

function lastSegment(path: string): string {
  const segs = splitPath(path);
  return segs[segs.length - 1] ?? path;
}

/**
 * The section a suggestion may come from: the deepest existing mapping above `key`, so a typo under
 * actor_rollout_ref.rollout is matched against the rollout's keys only (its siblings and their subtrees).
 */
function candidatePaths(cfg: ConfigNode, key: string): string[] {
  const segs = splitPath(key);
  for (let n = segs.length - 1; n > 0; n--) {
    const parent = getPath(cfg, segs.slice(0, n));
    if (isNode(parent)) {
      const prefix = segs.slice(0, n).join(".");
      return listPaths(parent, prefix);
    }
  }
  return listPaths(cfg);
}

/**
 * Up to `limit` existing dotted paths closest to `key`, best first: a key of exactly the same name
 * elsewhere (put in the wrong section) if there is one, else near spellings from the key's own section.
 */
export function suggestKeys(cfg: ConfigNode, key: string, limit = 3): string[] {
  const last = lastSegment(key);
  const sameName = listPaths(cfg).filter((p) => lastSegment(p) === last);
  if (sameName.length > 0) return closest(sameName, key, limit);
  return closest(candidatePaths(cfg, key), key, limit);
}

function closest(paths: readonly string[], key: string, limit: number): string[] {
  const last = lastSegment(key);
  const fullLimit = Math.max(2, Math.floor(key.length * 0.25));
  const lastLimit = Math.max(1, Math.floor(last.length * 0.34));
  const scored: { path: string; rank: [number, number, number] }[] = [];
  for (const path of paths) {
    // A key written without its leading groups, or cut short, is the likeliest mistake of all.
    const tier = path.endsWith(`.${key}`) ? 0 : path.startsWith(key) ? 1 : 2;
    const fullD = editDistance(key, path);
    const lastD = editDistance(last, lastSegment(path));
    if (tier === 2 && fullD > fullLimit && lastD > lastLimit) continue;
    scored.push({ path, rank: [tier, tier === 2 ? Math.min(fullD, lastD) : 0, fullD] });
  }
  scored.sort((x, y) => x.rank[0] - y.rank[0] || x.rank[1] - y.rank[1] || x.rank[2] - y.rank[2] || x.path.localeCompare(y.path));
  const best = scored[0];
  if (!best) return [];
  // Only the equally good: a typo in one key should not drag in every key sharing its last segment.
  return scored
    .filter((s) => s.rank[0] === best.rank[0] && s.rank[1] === best.rank[1] && s.rank[2] <= best.rank[2] + fullLimit)
    .slice(0, limit)
    .map((s) => s.path);
}

/** The sentence that follows "key X is not in the config": suggestions, else the keys beside it. */
export function unknownKeyHint(cfg: ConfigNode, key: string): string {
  const close = suggestKeys(cfg, key);
  if (close.length > 0) return `did you mean ${close.join(", or ")}?`;
  const segs = splitPath(key);
  for (let n = segs.length - 1; n >= 0; n--) {
    const parent = n === 0 ? cfg : getPath(cfg, segs.slice(0, n));
    if (isNode(parent)) {
      const keys = Object.keys(parent).sort();
      const where = n === 0 ? "the top level" : segs.slice(0, n).join(".");
      const shown = keys.slice(0, 12).join(", ") + (keys.length > 12 ? ", ..." : "");
      return `${where} has: ${shown || "(nothing)"}`;
    }
  }
  return "";
}
