// Python's repr() for the str and float values verl's tools print into their
// responses (f"{answer=}"), so the model sees the same text as under verl.

/** repr(str): single quotes unless the text has ' and no ", escapes as CPython prints them. */
export function pyStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const cp = ch.codePointAt(0)!;
    if (ch === "\\") out += "\\\\";
    else if (ch === quote) out += "\\" + quote;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (cp < 0x20 || cp === 0x7f) out += "\\x" + cp.toString(16).padStart(2, "0");
    else if (cp >= 0x80 && cp < 0xa0) out += "\\x" + cp.toString(16).padStart(2, "0");
    else out += ch;
  }
  return out + quote;
}

/** repr(float): "1.0" for whole numbers, shortest round-trip digits otherwise, Python's exponent style. */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (Object.is(x, -0)) return "-0.0";
  const abs = Math.abs(x);
  if (abs !== 0 && (abs < 1e-4 || abs >= 1e16)) {
    // Python: mantissa without a trailing ".0", exponent with a sign and at least two digits.
    const [mant, exp] = x.toExponential().split("e") as [string, string];
    const sign = exp.startsWith("-") ? "-" : "+";
    return `${mant}e${sign}${exp.replace(/^[+-]/, "").padStart(2, "0")}`;
  }
  const s = String(x);
  return Number.isInteger(x) ? `${s}.0` : s;
}
