// The `tensorboard` tracking backend: scalars into an event file under
// $TENSORBOARD_DIR, else tensorboard_log/{project}/{experiment} (verl's layout),
// named events.out.tfevents.{seconds}.{host}.{pid}.{n} as torch's SummaryWriter
// names them. A resumed run starts a new file that opens with SessionLog START at
// the first redone step, so TensorBoard drops the old file's later points.
import { accessSync, constants, existsSync, mkdirSync } from "node:fs";
import { hostname } from "node:os";
import { dirname, join, resolve } from "node:path";
import { writeErrorAt } from "../fs.js";
import { logger } from "../logger.js";
import { EventFileWriter, type ScalarValue } from "./event_file.js";

export function tensorboardDir(projectName: string, experimentName: string, env: NodeJS.ProcessEnv = process.env): string {
  return resolve(env.TENSORBOARD_DIR ?? join("tensorboard_log", projectName, experimentName));
}

let filesOpened = 0;

export class TensorboardBackend {
  readonly dir: string;
  private writer: EventFileWriter | null = null;

  constructor(projectName: string, experimentName: string) {
    this.dir = tensorboardDir(projectName, experimentName);
  }

  get path(): string | null {
    return this.writer?.path ?? null;
  }

  begin(resumedStep: number): void {
    this.makeDir();
    const now = Date.now() / 1000;
    const path = join(this.dir, `events.out.tfevents.${Math.floor(now)}.${hostname()}.${process.pid}.${filesOpened++}`);
    this.writing(path, () => {
      this.writer = new EventFileWriter(path, now);
      if (resumedStep > 0) this.writer.write([{ wallTime: now, step: resumedStep + 1, sessionStatus: 1 }]);
    });
    logger().info({ path }, "tensorboard event file");
  }

  /** Node's errors name the syscall, not always the path (a write) nor the right cause (ENOENT from a recursive mkdir). */
  private writing(path: string, fn: () => void): void {
    try {
      fn();
    } catch (e) {
      throw writeErrorAt(path, e, "its event file", "tensorboard logger");
    }
  }

  private makeDir(): void {
    try {
      mkdirSync(this.dir, { recursive: true });
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      const where = `tensorboard logger: cannot create its folder ${this.dir} (TENSORBOARD_DIR or tensorboard_log/{project}/{experiment})`;
      let parent = dirname(this.dir);
      while (!existsSync(parent) && dirname(parent) !== parent) parent = dirname(parent);
      let writable = true;
      try {
        accessSync(parent, constants.W_OK);
      } catch {
        writable = false;
      }
      const why = !writable ? `${parent} is not writable by this process` : err.message;
      throw Object.assign(new Error(`${where}: ${why}`, { cause: e }), { code: writable ? err.code : "EACCES" });
    }
  }

  log(data: Record<string, unknown>, step: number): void {
    if (!this.writer) this.begin(0);
    const scalars: ScalarValue[] = [];
    for (const [tag, v] of Object.entries(data)) {
      if (typeof v === "number") scalars.push({ tag, value: v });
      else if (typeof v === "boolean") scalars.push({ tag, value: v ? 1 : 0 });
    }
    const w = this.writer!;
    if (scalars.length > 0) this.writing(w.path, () => w.write([{ wallTime: Date.now() / 1000, step, scalars }]));
  }

  finish(): void {
    const w = this.writer;
    this.writer = null;
    if (w) this.writing(w.path, () => w.close());
  }
}
