// Typed reads of the composed config (a plain nested object with verl's
// snake_case keys). Every read names the full key in its error, so a bad
// override fails with the key the user typed.
import { getPath, type Config } from "../config/index.js";

export class ConfigView {
  constructor(readonly root: Config, readonly prefix = "") {}

  key(k: string): string {
    return this.prefix ? `${this.prefix}.${k}` : k;
  }

  /** A view of a sub-section (the section itself may be missing: reads then see undefined). */
  at(k: string): ConfigView {
    return new ConfigView(this.root, this.key(k));
  }

  raw(k: string): unknown {
    return getPath(this.root, this.key(k));
  }

  /** The sub-section as a plain object ({} when absent). */
  section(k = ""): Record<string, unknown> {
    const v = k ? this.raw(k) : this.prefix ? getPath(this.root, this.prefix) : this.root;
    if (v === undefined || v === null) return {};
    if (typeof v !== "object" || Array.isArray(v)) throw new Error(`${k ? this.key(k) : this.prefix} must be a mapping, got ${JSON.stringify(v)}`);
    return v as Record<string, unknown>;
  }

  num(k: string, fallback?: number): number {
    const v = this.raw(k);
    if (v === undefined || v === null) {
      if (fallback !== undefined) return fallback;
      throw new Error(`config key ${this.key(k)} is required (a number)`);
    }
    if (typeof v !== "number" || !Number.isFinite(v)) throw new Error(`${this.key(k)} must be a number, got ${JSON.stringify(v)}`);
    return v;
  }

  optNum(k: string): number | null {
    const v = this.raw(k);
    return v === undefined || v === null ? null : this.num(k);
  }

  int(k: string, fallback?: number): number {
    const v = this.num(k, fallback);
    if (!Number.isInteger(v)) throw new Error(`${this.key(k)} must be an integer, got ${v}`);
    return v;
  }

  optInt(k: string): number | null {
    const v = this.raw(k);
    return v === undefined || v === null ? null : this.int(k);
  }

  bool(k: string, fallback = false): boolean {
    const v = this.raw(k);
    if (v === undefined || v === null) return fallback;
    if (typeof v !== "boolean") throw new Error(`${this.key(k)} must be true or false, got ${JSON.stringify(v)}`);
    return v;
  }

  str(k: string, fallback?: string): string {
    const v = this.raw(k);
    if (v === undefined || v === null) {
      if (fallback !== undefined) return fallback;
      throw new Error(`config key ${this.key(k)} is required (a string)`);
    }
    if (typeof v !== "string") throw new Error(`${this.key(k)} must be a string, got ${JSON.stringify(v)}`);
    return v;
  }

  optStr(k: string): string | null {
    const v = this.raw(k);
    return v === undefined || v === null ? null : this.str(k);
  }

  strList(k: string): string[] {
    const v = this.raw(k);
    if (v === undefined || v === null) return [];
    if (typeof v === "string") return [v];
    if (Array.isArray(v) && v.every((x) => typeof x === "string")) return v as string[];
    throw new Error(`${this.key(k)} must be a string or a list of strings, got ${JSON.stringify(v)}`);
  }
}
