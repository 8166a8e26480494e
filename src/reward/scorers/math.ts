// MATH answer matching with verl's rules (verl/utils/reward_score/math_reward.py,
// itself from lm-evaluation-harness): take the last \boxed{...} (or "\boxed x"),
// strip the wrapper, normalise both strings (strip_string) and compare them.
// Python's failures are kept: an assertion or index error inside the
// normalisation makes is_equiv fall back to raw equality, and any error in
// extraction scores 0. Indexing counts code points, as Python's str does.

/** Raised where verl's Python raises (assert / IndexError); callers catch it like verl does. */
class MathNormaliseError extends Error {}

function fail(what: string): never {
  throw new MathNormaliseError(what);
}

export function lastBoxedOnlyString(s: string): string | null {
  let idx = s.lastIndexOf("\\boxed");
  if (s.includes("\\boxed ")) {
    const parts = s.split("\\boxed ");
    return "\\boxed " + parts[parts.length - 1]!.split("$")[0]!;
  }
  if (idx < 0) {
    idx = s.lastIndexOf("\\fbox");
    if (idx < 0) return null;
  }
  let open = 0;
  for (let i = idx; i < s.length; i++) {
    if (s[i] === "{") open++;
    if (s[i] === "}") {
      open--;
      if (open === 0) return s.slice(idx, i + 1);
    }
  }
  return null;
}

export function removeBoxed(s: string): string {
  if (s.includes("\\boxed ")) {
    const left = "\\boxed ";
    if (!s.startsWith(left)) fail("remove_boxed: text before '\\boxed '");
    return s.slice(left.length);
  }
  const left = "\\boxed{";
  if (!s.startsWith(left)) fail("remove_boxed: does not start with \\boxed{");
  if (!s.endsWith("}")) fail("remove_boxed: does not end with }");
  return s.slice(left.length, -1);
}

/** \frac12 -> \frac{1}{2}, \frac1{72} -> \frac{1}{72}; leaves \frac{..}{..} alone. */
function fixFracs(s: string): string {
  const parts = s.split("\\frac");
  let out = parts[0]!;
  for (const part of parts.slice(1)) {
    out += "\\frac";
    const cps = Array.from(part);
    if (cps.length === 0) fail("fix_fracs: nothing after \\frac"); // Python: substr[0] IndexError
    if (cps[0] === "{") {
      out += part;
      continue;
    }
    if (cps.length < 2) return s;
    const a = cps[0]!, b = cps[1]!, rest = cps.slice(2).join("");
    out += b !== "{" ? `{${a}}{${b}}${rest}` : `{${a}}${b}${rest}`;
  }
  return out;
}

/** "3/4" -> \frac{3}{4} when both sides are plain integers written canonically (Python's int round trip). */
function fixASlashB(s: string): string {
  const parts = s.split("/");
  if (parts.length !== 2) return s;
  const canonicalInt = /^(0|-?[1-9][0-9]*)$/;
  if (!canonicalInt.test(parts[0]!) || !canonicalInt.test(parts[1]!)) return s;
  return `\\frac{${parts[0]}}{${parts[1]}}`;
}

/** "5\text{ cm}" -> "5": "\text{ " only ever introduces units in MATH. */
function removeRightUnits(s: string): string {
  if (!s.includes("\\text{ ")) return s;
  const parts = s.split("\\text{ ");
  if (parts.length !== 2) fail("remove_right_units: more than one '\\text{ '");
  return parts[0]!;
}

/** \sqrt3 -> \sqrt{3}. */
function fixSqrt(s: string): string {
  if (!s.includes("\\sqrt")) return s;
  const parts = s.split("\\sqrt");
  let out = parts[0]!;
  for (const part of parts.slice(1)) {
    const cps = Array.from(part);
    if (cps.length === 0) fail("fix_sqrt: nothing after \\sqrt"); // Python: split[0] IndexError
    out += cps[0] !== "{" ? `\\sqrt{${cps[0]}}${cps.slice(1).join("")}` : `\\sqrt${part}`;
  }
  return out;
}

export function stripString(input: string): string {
  let s = input
    .replaceAll("\n", "")
    .replaceAll("\\!", "")
    .replaceAll("\\\\", "\\")
    .replaceAll("tfrac", "frac")
    .replaceAll("dfrac", "frac")
    .replaceAll("\\left", "")
    .replaceAll("\\right", "")
    .replaceAll("^{\\circ}", "")
    .replaceAll("^\\circ", "")
    .replaceAll("\\$", "");
  s = removeRightUnits(s);
  s = s.replaceAll("\\\\%", "").replaceAll("\\%", "");
  // " .5" -> " 0.5", "{.5" -> "{0.5", leading ".5" -> "0.5"
  s = s.replaceAll(" .", " 0.").replaceAll("{.", "{0.");
  if (s.length === 0) return s;
  if (s[0] === ".") s = "0" + s;
  // "k = 3" -> " 3": drop a short left-hand side
  const eq = s.split("=");
  if (eq.length === 2 && Array.from(eq[0]!).length <= 2) s = eq[1]!;
  s = fixSqrt(s);
  s = s.replaceAll(" ", "");
  s = fixFracs(s);
  if (s === "0.5") s = "\\frac{1}{2}";
  return fixASlashB(s);
}

export function isEquiv(a: string | null, b: string | null): boolean {
  if (a === null && b === null) return true;
  if (a === null || b === null) return false;
  try {
    return stripString(a) === stripString(b);
  } catch (e) {
    if (e instanceof MathNormaliseError) return a === b;
    throw e;
  }
}

/** 1.0 when the last boxed answer is equivalent to the ground truth, else 0.0. */
export function mathComputeScore(solutionStr: string, groundTruth: unknown): number {
  try {
    const boxed = lastBoxedOnlyString(solutionStr);
    if (boxed === null) return 0;
    return isEquiv(removeBoxed(boxed), typeof groundTruth === "string" ? groundTruth : String(groundTruth)) ? 1 : 0;
  } catch (e) {
    if (e instanceof MathNormaliseError) return 0;
    throw e;
  }
}
