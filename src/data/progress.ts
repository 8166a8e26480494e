// Progress for long data jobs, on stderr: a self-overwriting line on a terminal,
// a few log lines (every 25%) otherwise so CI logs stay short.
import { logger } from "../utils/logger.js";

export interface Progress {
  tick(n?: number): void;
  done(extra?: string): void;
}

export function createProgress(label: string, total: number, stream: NodeJS.WriteStream = process.stderr): Progress {
  const tty = Boolean(stream.isTTY);
  const start = Date.now();
  let count = 0;
  let nextLog = 0.25;
  let lastDraw = 0;
  const draw = () => {
    const pct = total > 0 ? Math.floor((100 * count) / total) : 100;
    stream.write(`\r${label}: ${count}/${total} (${pct}%)`);
  };
  return {
    tick(n = 1) {
      count += n;
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
