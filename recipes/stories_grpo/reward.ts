// Reward for the stories260K GRPO recipe, loaded through
// custom_reward_function.path: 1 when the story mentions the target word (the
// row's reward_model.ground_truth, as a whole word, any case), else 0. An
// optional `max_chars` in reward_kwargs also asks the story to stay that short.
export function compute_score(
  _dataSource: string,
  solution: string,
  groundTruth: unknown,
  _extraInfo: unknown,
  kwargs: { max_chars?: number } = {},
): { score: number; mentions: number; chars: number } {
  if (typeof groundTruth !== "string" || !/^[a-z]+$/i.test(groundTruth)) {
    throw new Error(`stories reward: ground_truth must be one word of letters, got ${JSON.stringify(groundTruth)}`);
  }
  const mentions = (solution.match(new RegExp(`\\b${groundTruth}\\b`, "gi")) ?? []).length;
  const short = kwargs.max_chars === undefined || solution.length <= kwargs.max_chars;
  return { score: mentions > 0 && short ? 1 : 0, mentions, chars: solution.length };
}
