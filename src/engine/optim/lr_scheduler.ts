// A stepped learning-rate schedule with saveable state. The schedule itself (warmup,
// constant, cosine) is a multiplier function of the step; this class only counts
// steps, like torch's LambdaLR: `lr` is the rate for the current step, `step()`
// advances after each training step.

export interface LrSchedulerState {
  step: number;
}

export class LrScheduler {
  private stepCount = 0;

  constructor(readonly baseLr: number, private readonly multiplier: (step: number) => number) {}

  /** The learning rate to use now. */
  get lr(): number {
    return this.baseLr * this.multiplier(this.stepCount);
  }

  get currentStep(): number {
    return this.stepCount;
  }

  step(): void {
    this.stepCount += 1;
  }

  stateDict(): LrSchedulerState {
    return { step: this.stepCount };
  }

  loadStateDict(s: LrSchedulerState): void {
    if (!Number.isInteger(s.step) || s.step < 0) throw new Error(`LrScheduler.loadStateDict: bad step ${String(s.step)}`);
    this.stepCount = s.step;
  }
}
