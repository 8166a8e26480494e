// Opt-in wall-clock profile of a loop's phases (VERL_PROFILE_UPDATE=1): where an update's
// seconds go on a GPU, where the host records commands asynchronously and only reads block.
// Printed as one JSON line on stderr; no metric names of verl's are invented for it.

export class PhaseProfile {
  private readonly sums = new Map<string, number>();
  private readonly counts = new Map<string, number>();
  private last = performance.now();

  constructor(readonly label: string) {}

  /** Charges the time since the previous mark (or construction) to `phase`. */
  mark(phase: string): void {
    const now = performance.now();
    this.sums.set(phase, (this.sums.get(phase) ?? 0) + (now - this.last));
    this.counts.set(phase, (this.counts.get(phase) ?? 0) + 1);
    this.last = now;
  }

  /** Moves `ms` of what was charged to `from` over to `to` (e.g. the part of a collective spent waiting for peers). */
  move(from: string, to: string, ms: number): void {
    if (!(ms > 0)) return;
    this.sums.set(from, (this.sums.get(from) ?? 0) - ms);
    this.sums.set(to, (this.sums.get(to) ?? 0) + ms);
    this.counts.set(to, (this.counts.get(to) ?? 0) + 1);
  }

  summary(extra: Record<string, unknown> = {}): Record<string, unknown> {
    const ms: Record<string, number> = {};
    for (const [k, v] of this.sums) ms[k] = Math.round(v * 10) / 10;
    return { profile: this.label, ms, counts: Object.fromEntries(this.counts), ...extra };
  }

  print(extra: Record<string, unknown> = {}): void {
    process.stderr.write(`[verl-ts] ${JSON.stringify(this.summary(extra))}\n`);
  }
}

/** A profile when VERL_PROFILE_UPDATE=1, else null (no cost). */
export function phaseProfile(label: string): PhaseProfile | null {
  return process.env.VERL_PROFILE_UPDATE === "1" ? new PhaseProfile(label) : null;
}
