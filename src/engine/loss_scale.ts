// Dynamic loss scaling for 16-bit matrix products (issue 23). With f16 inputs to the tensor-core
// products (webgpu_kernels.ts), small gradients flush to zero in the backward pass: the 0.5B
// GRPO run's KL-only gradients (1e-8 and below) came out exactly 0. The loss is multiplied by a
// power of two before the backward pass and the gradients divided by it after (exact in
// floating point); a step whose gradient norm is not finite is skipped by the optimizer and
// halves the scale, and every `growthInterval` finite steps double it (PyTorch GradScaler's rule
// and defaults).
export class DynamicLossScale {
  scale: number;
  private good = 0;
  constructor(readonly initial = 2 ** 16, readonly growthInterval = 2000, readonly minScale = 1) {
    this.scale = initial;
  }

  /** After an optimizer step: `skipped` when the gradient norm was not finite. */
  update(skipped: boolean): void {
    if (skipped) {
      this.scale = Math.max(this.minScale, this.scale / 2);
      this.good = 0;
    } else if (++this.good >= this.growthInterval) {
      this.scale *= 2;
      this.good = 0;
    }
  }
}
