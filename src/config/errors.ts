// Errors in configuration: bad overrides, unknown keys, type mismatches, failed
// interpolation, impossible batch-size arithmetic. The CLI exits with code 2 for
// these (like Hydra's usage errors), 1 for everything else.
export class ConfigError extends Error {
  readonly exitCode = 2;

  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}
