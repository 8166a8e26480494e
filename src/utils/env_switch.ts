// On/off switches read from the environment (VERL_* comparisons and escape hatches).

/**
 * A switch `name` given as 0 or 1: unset or empty gives `fallback`, anything else is an error naming
 * the variable. `value` defaults to the environment's (tests pass their own).
 */
export function envSwitch(name: string, fallback: boolean, value: string | undefined = process.env[name]): boolean {
  if (value === undefined || value === "") return fallback;
  if (value === "1") return true;
  if (value === "0") return false;
  throw new Error(`${name} must be 0 or 1, got '${value}'`);
}
