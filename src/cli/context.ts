// What main.ts hands a subcommand: the resolved config, the raw overrides and the parsed options.
import type { Config } from "../config/index.js";

export interface CommandContext {
  config: Config;
  overrides: string[];
  options: Record<string, unknown>;
}

/** An error a command throws to end the CLI with a given exit code and a one-line message. */
export class CliError extends Error {
  constructor(message: string, readonly exitCode = 1) {
    super(message);
    this.name = "CliError";
  }
}

/** The error a placeholder subcommand throws until its layer lands. */
export function notBuilt(command: string, issue: string): CliError {
  return new CliError(`\`verl ${command}\` is not built yet (see ${issue})`, 1);
}
