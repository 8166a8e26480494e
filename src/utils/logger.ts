// One pino logger for the process. JSON lines to stderr; pretty when stderr is a
// terminal. Worker threads log through the driver (a transport made inside a
// worker thread loses lines), so workers call `createLogger` with pretty off.
import { pino, type Logger, type Level } from "pino";

let root: Logger | undefined;

export function createLogger(level: Level | string = process.env.VERL_LOG_LEVEL ?? "info"): Logger {
  const pretty = process.stderr.isTTY && !process.env.CI;
  if (pretty) {
    return pino({
      level,
      transport: { target: "pino-pretty", options: { destination: 2, colorize: true, translateTime: "HH:MM:ss", ignore: "pid,hostname" } },
    });
  }
  return pino({ level, base: undefined }, pino.destination({ dest: 2, sync: true }));
}

/** The process-wide logger; `setLogLevel` follows `trainer.log_level`. */
export function logger(): Logger {
  root ??= createLogger();
  return root;
}

export function setLogLevel(level: string): void {
  logger().level = level;
}
