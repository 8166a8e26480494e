// Weights a run starts from must be finite: a NaN or an infinity (a corrupt file,
// or a checkpoint of a run that diverged) would make every loss NaN and every
// optimizer step skipped, so loading refuses it, naming the tensor and the file.

/** Throws when `data` holds a NaN or an infinity. */
export function requireFiniteWeights(data: ArrayLike<number>, tensor: string, file: string): void {
  for (let i = 0; i < data.length; i++) {
    const v = data[i]!;
    // v - v is 0 for every finite v and NaN otherwise (cheaper than Number.isFinite per element).
    if (v - v !== 0) {
      throw new Error(`${file}: weight '${tensor}' holds ${v} (element ${i}); the file is corrupt or was saved by a run that diverged`);
    }
  }
}
