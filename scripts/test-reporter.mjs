// A small reporter for node:test. It prints one line per test file, the full
// error of every failure, and ends with "N passed, N failed, N skipped".
import { relative } from "node:path";

export default async function* reporter(source) {
  let passed = 0, failed = 0, skipped = 0;
  const failures = [];
  const perFile = new Map();
  const bump = (file, key) => {
    const f = perFile.get(file) ?? { pass: 0, fail: 0, skip: 0 };
    f[key]++;
    perFile.set(file, f);
  };
  for await (const ev of source) {
    const d = ev.data ?? {};
    const isLeaf = d.details?.type !== "suite" && !(d.file && d.name === d.file) && d.nesting !== undefined;
    if (ev.type === "test:pass" && isLeaf) {
      if (d.skip !== undefined && d.skip !== false) { skipped++; bump(d.file, "skip"); yield `  skip ${d.name}${typeof d.skip === "string" ? ` (${d.skip})` : ""}\n`; }
      else if (d.todo !== undefined && d.todo !== false) { skipped++; bump(d.file, "skip"); }
      else { passed++; bump(d.file, "pass"); }
    } else if (ev.type === "test:fail") {
      if (!isLeaf) {
        // A file that failed to load or a suite hook failure shows up here; count it once.
        const err = d.details?.error;
        if (err && err.failureType !== "subtestsFailed") {
          failed++;
          failures.push({ name: d.name, file: d.file, err });
        }
        continue;
      }
      failed++; bump(d.file, "fail");
      failures.push({ name: d.name, file: d.file, err: d.details?.error });
      yield `  FAIL ${d.name}\n`;
    } else if (ev.type === "test:stderr" || ev.type === "test:stdout") {
      if (process.env.VERL_TEST_VERBOSE) yield d.message;
    }
  }
  for (const [file, c] of perFile) {
    yield `${c.fail ? "✗" : "✓"} ${file ? relative(process.cwd(), file) : "?"}: ${c.pass} passed${c.fail ? `, ${c.fail} failed` : ""}${c.skip ? `, ${c.skip} skipped` : ""}\n`;
  }
  for (const f of failures) {
    const e = f.err;
    const cause = e?.cause ?? e;
    yield `\n--- FAILED: ${f.name} (${f.file ? relative(process.cwd(), f.file) : "?"})\n${cause?.stack ?? cause?.message ?? String(cause)}\n`;
  }
  yield `\n${passed} passed, ${failed} failed, ${skipped} skipped\n`;
}
