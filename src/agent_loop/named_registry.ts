// A name -> value table for the extension points of this layer (agent loops,
// tool parsers, tool and interaction classes). Unknown names list the known
// ones; re-registering a different value under a taken name is an error.

export class NamedRegistry<T> {
  private readonly entries = new Map<string, T>();

  constructor(private readonly what: string) {}

  register(name: string, value: T): void {
    if (typeof name !== "string" || name.length === 0) throw new Error(`${this.what}: name must be a non-empty string`);
    const existing = this.entries.get(name);
    if (existing !== undefined && existing !== value) {
      throw new Error(`${this.what} '${name}' is already registered with a different value`);
    }
    this.entries.set(name, value);
  }

  get(name: string): T {
    const value = this.entries.get(name);
    if (value === undefined) throw new Error(`unknown ${this.what} '${name}' (known: ${this.names().join(", ") || "none"})`);
    return value;
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  names(): string[] {
    return [...this.entries.keys()];
  }

  /** The table as a read-only map (for module-spec built-ins). */
  asMap(): ReadonlyMap<string, T> {
    return this.entries;
  }
}
