// Progress for long data jobs, on stderr: a self-overwriting line on a terminal,
// a few log lines (every 25%) otherwise so CI logs stay short.
import { logger } from "../utils/logger.js";

export interface Progress {
  tick(n?: number): void;
  /** Work inside the current item (e.g. the token being decoded): shown on a terminal only. */
  status(detail: string): void;
  done(extra?: string): void;
}

export function createProgress(label: string, total: number, stream: NodeJS.WriteStream = process.stderr): Progress {
  const tty = Boolean(stream.isTTY);
  const start = Date.now();
  let count = 0;
  let nextLog = 0.25;
  let lastDraw = 0;
  let detail = "";
  // \x1b[K clears what a longer earlier line left behind.
  const draw = () => {
    const pct = total > 0 ? Math.floor((100 * count) / total) : 100;
    stream.write(`\r${label}: ${count}/${total} (${pct}%)${detail ? ` ${detail}` : ""}\x1b[K`);
  };
  // The line shows at once, not only after the first item: one item may take minutes.
  if (tty) draw();
  return {
    status(text: string) {
      if (!tty) return;
      detail = text;
      const now = Date.now();
      if (now - lastDraw > 100) { lastDraw = now; draw(); }
    },
    tick(n = 1) {
      count += n;
      detail = "";
      if (tty) {
        const now = Date.now();
        if (now - lastDraw > 100 || count >= total) { lastDraw = now; draw(); }
      } else if (total > 0 && count / total >= nextLog && count < total) {
        logger().info(`${label}: ${count}/${total} (${Math.floor((100 * count) / total)}%)`);
        while (count / total >= nextLog) nextLog += 0.25;
      }
    },
    done(extra = "") {
      const secs = ((Date.now() - start) / 1000).toFixed(2);
      if (tty) { draw(); stream.write(` done in ${secs}s${extra ? ` ${extra}` : ""}\n`); }
      else logger().info(`${label}: ${count}/${total} done in ${secs}s${extra ? ` ${extra}` : ""}`);
    },
  };
}
