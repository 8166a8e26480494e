// One pino logger for the process, on stderr. Human-readable lines by default ("HH:MM:ss INFO: msg
// key=value", coloured on a terminal); pino's JSON lines with VERL_LOG_FORMAT=json (for log shippers).
// Worker threads log through the driver, so the formatting is synchronous (a transport's thread
// made inside a worker thread loses lines).
import { pino, type Logger, type Level } from "pino";
import { build as pretty } from "pino-pretty";

let root: Logger | undefined;

/** VERL_LOG_FORMAT: "text" (default) or "json"; anything else is an error naming the variable. */
export function logFormat(env: NodeJS.ProcessEnv = process.env): "text" | "json" {
  const f = (env.VERL_LOG_FORMAT || "text").toLowerCase();
  if (f !== "text" && f !== "json") throw new Error(`VERL_LOG_FORMAT=${env.VERL_LOG_FORMAT}: use text (the default) or json`);
  return f;
}

export function createLogger(level: Level | string = process.env.VERL_LOG_LEVEL ?? "info"): Logger {
  if (logFormat() === "json") return pino({ level, base: undefined }, pino.destination({ dest: 2, sync: true }));
  const colorize = Boolean(process.stderr.isTTY) && !process.env.CI && !process.env.NO_COLOR;
  return pino({ level, base: undefined }, pretty({ destination: 2, sync: true, colorize, translateTime: "HH:MM:ss", ignore: "pid,hostname", singleLine: true }));
}
/** The process-wide logger; `setLogLevel` follows `trainer.log_level`. */
export function logger(): Logger {
  root ??= createLogger();
  return root;
}

export function setLogLevel(level: string): void {
  logger().level = level;
}
