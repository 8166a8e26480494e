// The `tensorboard` tracking backend: scalars into an event file under
// $TENSORBOARD_DIR, else tensorboard_log/{project}/{experiment} (verl's layout),
// named events.out.tfevents.{seconds}.{host}.{pid}.{n} as torch's SummaryWriter
// names them. A resumed run starts a new file that opens with SessionLog START at
// the first redone step, so TensorBoard drops the old file's later points.
import { mkdirSync } from "node:fs";
import { hostname } from "node:os";
import { join, resolve } from "node:path";
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
    mkdirSync(this.dir, { recursive: true });
    const now = Date.now() / 1000;
    const name = `events.out.tfevents.${Math.floor(now)}.${hostname()}.${process.pid}.${filesOpened++}`;
    this.writer = new EventFileWriter(join(this.dir, name), now);
    if (resumedStep > 0) this.writer.write([{ wallTime: now, step: resumedStep + 1, sessionStatus: 1 }]);
    logger().info({ path: this.writer.path }, "tensorboard event file");
  }

  log(data: Record<string, unknown>, step: number): void {
    if (!this.writer) this.begin(0);
    const scalars: ScalarValue[] = [];
    for (const [tag, v] of Object.entries(data)) {
      if (typeof v === "number") scalars.push({ tag, value: v });
      else if (typeof v === "boolean") scalars.push({ tag, value: v ? 1 : 0 });
    }
    if (scalars.length > 0) this.writer!.write([{ wallTime: Date.now() / 1000, step, scalars }]);
  }

  finish(): void {
    this.writer?.close();
    this.writer = null;
  }
}
