// What a reward function (or a reward loop class) gets from a generative reward model served for the
// run (reward_model_server.ts): verl's reward loop adds reward_router_address and reward_model_tokenizer
// to each call. The reference is plain data, so scoring threads receive it and load the tokenizer themselves.
import type { Config } from "../config/index.js";

export interface ServedRewardModelRef {
  /** "127.0.0.1:<port>", verl's reward_router_address (no scheme). */
  routerAddress: string;
  /** The composed config, for the reward model's tokenizer (reward_model.model). */
  config: Config;
}

/** The keyword arguments verl's reward loop adds to a custom reward function's call, built in the calling thread. */
export async function servedRewardModelKwargs(ref: ServedRewardModelRef): Promise<{ reward_router_address: string; reward_model_tokenizer: unknown }> {
  // loaded here only: plain scoring threads do not pay for the model modules
  const [{ ConfigView }, { loadModelTokenizer }] = await Promise.all([import("../workers/config_view.js"), import("../workers/model_source.js")]);
  const tokenizer = await loadModelTokenizer(new ConfigView(ref.config).at("reward_model.model"));
  return { reward_router_address: ref.routerAddress, reward_model_tokenizer: tokenizer };
}
