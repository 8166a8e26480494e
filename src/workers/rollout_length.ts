// A rollout must fit the model: prompt_length + response_length positions at most
// max_position_embeddings (RoPE past it is extrapolation the model never saw). The agent-loop
// server refuses such a length; this check makes the single-turn path refuse it too, at start-up.
import type { ModelConfig } from "../models/config.js";
import type { ConfigView } from "./config_view.js";

export function checkRolloutFitsModel(rollout: ConfigView, model: ModelConfig): void {
  const prompt = rollout.int("prompt_length"), response = rollout.int("response_length");
  // dynamic (NTK) RoPE is made to run past max_position_embeddings, as transformers lets it
  if (prompt + response > model.maxSeqLen && model.ropeScaling?.type !== "dynamic") {
    throw new Error(
      `actor_rollout_ref.rollout: prompt_length ${prompt} + response_length ${response} = ${prompt + response} exceeds the model's `
      + `max_position_embeddings ${model.maxSeqLen}; lower data.max_prompt_length / data.max_response_length`,
    );
  }
}
