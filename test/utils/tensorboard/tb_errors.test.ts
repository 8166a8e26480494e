// Issue 28 item 13: the tensorboard logger's errors name the logger and the path:
// a full disk (the kernel's ENOSPC from /dev/full: the event file's open is routed
// there) and a folder it may not create (a real read-only folder, as an
// unprivileged user when the tests run as root).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs, { chmodSync, existsSync, mkdtempSync, rmSync } from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { TensorboardBackend } from "../../../src/utils/tensorboard/backend.js";

process.env.VERL_LOG_LEVEL ??= "fatal";

function withEnv<T>(key: string, value: string, body: () => T): T {
  const prev = process.env[key];
  process.env[key] = value;
  try {
    return body();
  } finally {
    if (prev === undefined) delete process.env[key]; else process.env[key] = prev;
  }
}

test("a full disk under the event file names the logger and the file", { skip: !existsSync("/dev/full") && "no /dev/full" }, () => {
  const dir = mkdtempSync(join(tmpdir(), "verl-tb-full-"));
  const { openSync } = fs;
  try {
    withEnv("TENSORBOARD_DIR", dir, () => {
      const tb = new TensorboardBackend("p", "e");
      fs.openSync = ((p: fs.PathLike, flags?: fs.OpenMode, mode?: fs.Mode) => openSync(typeof p === "string" && p.startsWith(dir) ? "/dev/full" : p, flags ?? "r", mode)) as typeof fs.openSync;
      syncBuiltinESMExports();
      try {
        assert.throws(() => tb.log({ "critic/score/mean": 0.5 }, 1), (e: Error & { code?: string }) => {
          assert.equal(e.code, "ENOSPC");
          assert.match(e.message, new RegExp(`^tensorboard logger: cannot write its event file ${dir}/events\\.out\\.tfevents\\.[^:]+: ENOSPC: no space left on device, write; the disk is full`));
          return true;
        });
      } finally {
        fs.openSync = openSync;
        syncBuiltinESMExports();
      }
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

const isRoot = process.getuid?.() === 0;
const probe = fileURLToPath(new URL("./tb_probe.js", import.meta.url));

test("a read-only folder: the error names the logger, the folder it could not create and the one that is not writable", { skip: process.platform === "win32" && "POSIX permissions" }, () => {
  const root = mkdtempSync(join(tmpdir(), "verl-tb-ro-"));
  chmodSync(root, 0o755);
  const ro = join(root, "ro");
  fs.mkdirSync(ro, { mode: 0o555 });
  chmodSync(ro, 0o555);
  try {
    for (const target of [join(ro, "a", "b"), ro]) {
      // root ignores permissions: run the logger as nobody
      const r = spawnSync(process.execPath, [probe, target], { encoding: "utf8", ...(isRoot ? { uid: 65534, gid: 65534 } : {}) });
      assert.equal(r.status, 0, r.stderr);
      const msg = r.stdout.trim();
      if (target === ro) {
        assert.match(msg, new RegExp(`^EACCES tensorboard logger: cannot write its event file ${ro}/events\\.out\\.tfevents\\.\\S+: EACCES`));
      } else {
        assert.equal(msg, `EACCES tensorboard logger: cannot create its folder ${target} (TENSORBOARD_DIR or tensorboard_log/{project}/{experiment}): ${ro} is not writable by this process`);
      }
    }
  } finally {
    chmodSync(ro, 0o755);
    rmSync(root, { recursive: true, force: true });
  }
});
