// A generative reward model served for the run (reward_model.enable with reward_model.rollout.name=
// vllm|sglang and custom_reward_function.path, verl's GenRM set-up): the model at
// reward_model.model.path decodes in a continuous-batching server behind an OpenAI-compatible HTTP
// front on 127.0.0.1 (rollout/openai_http_server.ts), and the reward function gets its address and
// the model's tokenizer. The trainer starts it before the reward managers and closes it when the run
// ends, failed or not. Its weights never change, so they are read for decoding once.
import type { Config } from "../config/index.js";
import { generativeRewardModel } from "../config/validate.js";
import { ContinuousBatchingServer } from "../agent_loop/batching_server.js";
import type { LlamaModel } from "../models/llama.js";
import { OpenAiHttpServer } from "../rollout/openai_http_server.js";
import { Rng } from "../utils/rng.js";
import { logger } from "../utils/logger.js";
import { ConfigView } from "../workers/config_view.js";
import { expandHome, loadModelTokenizer, loadPolicy } from "../workers/model_source.js";
import type { ServedRewardModelRef } from "./served_reward_model.js";

export class RewardModelServer {
  private constructor(private readonly http: OpenAiHttpServer, private readonly server: ContinuousBatchingServer, private readonly model: LlamaModel, readonly ref: ServedRewardModelRef) {}

  /** The server the config asks for, or null when the reward model is not generative. */
  static async startIfConfigured(config: Config): Promise<RewardModelServer | null> {
    const engine = generativeRewardModel(config);
    if (engine === null) return null;
    const cfg = new ConfigView(config);
    const modelCfg = cfg.at("reward_model.model"), ro = cfg.at("reward_model.rollout");
    const tokenizer = await loadModelTokenizer(modelCfg);
    // (the reward-model worker's seed: a scratch model is the same one either way)
    const model = await loadPolicy(modelCfg, tokenizer, cfg.int("trainer.seed", 42) + 17);
    try {
      const maxModelLen = ro.optInt("max_model_len") ?? model.config.maxSeqLen;
      // at most the rows one step scores at once hold a cache slot (each slot holds max_model_len of K/V); more wait
      const rowsPerStep = cfg.int("data.train_batch_size", 1) * cfg.int("actor_rollout_ref.rollout.n", 1);
      const server = new ContinuousBatchingServer(model, {
        maxNumSeqs: Math.max(1, Math.min(ro.int("max_num_seqs", 1024), rowsPerStep)), maxModelLen, eosTokenIds: tokenizer.eosTokenIds, rng: new Rng(0),
      });
      await server.wakeUp();
      const path = modelCfg.str("path");
      const http = await OpenAiHttpServer.start({
        server, tokenizer, maxModelLen, seed: 0, sglangGenerate: engine === "sglang", label: "reward model server",
        modelNames: [...new Set([path, expandHome(path)])],
        // verl's override_generation_config for the served model: the rollout section's sampling, max_new_tokens = response_length
        defaults: { temperature: ro.num("temperature", 1), topP: ro.num("top_p", 1), topK: ro.int("top_k", -1), maxTokens: ro.int("response_length", 2048) },
      });
      logger().info({ address: http.address, model: path, engine }, "generative reward model served");
      return new RewardModelServer(http, server, model, { routerAddress: http.address, config });
    } catch (e) {
      model.dispose();
      throw e;
    }
  }

  /** Stops listening, rejects what is still decoding, frees the engine and its caches, then the weights. */
  async close(): Promise<void> {
    try {
      await this.http.close();
    } finally {
      this.server.abort();
      await this.server.sleep();
      this.model.dispose();
    }
  }
}
