// Every composed key has a kind, and each kind behaves as declared (src/config/key_kinds.ts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { composeConfig } from "../../src/config/compose.js";
import { checkKeyKinds, keyReportWarning, leafEntries } from "../../src/config/key_check.js";
import { patternToRegExp, ruleFor } from "../../src/config/key_kinds.js";
import { ConfigError, getPath, loadConfig, loadConfigDetailed } from "../../src/config/index.js";
import { packageRoot } from "../../src/utils/paths.js";

const ROOTS = ["ppo_trainer", "ppo_megatron_trainer", "sft_trainer", "generation", "evaluation"];

test("every leaf of every composed root config has a declared kind", () => {
  const missing: string[] = [];
  for (const name of ROOTS) for (const [k] of leafEntries(composeConfig({ configName: name }))) if (!ruleFor(k)) missing.push(`${name}: ${k}`);
  assert.deepEqual(missing, []);
});

test("keys beyond verl's schema are declared verl-ts's own", () => {
  const schema = JSON.parse(readFileSync(join(packageRoot, "test/config/fixtures/verl_schema.json"), "utf8")) as { configs: Record<string, Record<string, unknown>> };
  const verlPpo = new Set([...Object.keys(schema.configs.ppo_trainer!), ...Object.keys(schema.configs.ppo_megatron_trainer!)]);
  const verlSft = new Set(Object.keys(schema.configs.sft_trainer!));
  const notOwn: string[] = [];
  for (const [name, verl] of [["ppo_trainer", verlPpo], ["ppo_megatron_trainer", verlPpo], ["sft_trainer", verlSft]] as const) {
    for (const [k] of leafEntries(composeConfig({ configName: name }))) if (!verl.has(k) && !ruleFor(k)?.own) notOwn.push(`${name}: ${k}`);
  }
  assert.deepEqual(notOwn, []);
});

test("patterns: * is one segment, ** one or more, {a,b} alternatives", () => {
  assert.ok(patternToRegExp("a.*.c").test("a.b.c"));
  assert.ok(!patternToRegExp("a.*.c").test("a.b.x.c"));
  assert.ok(patternToRegExp("**.fsdp_config.**").test("actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params"));
  assert.ok(!patternToRegExp("**.fsdp_config.**").test("fsdp_config.x"));
  assert.ok(patternToRegExp("{**.,}megatron.**").test("megatron.x"));
  assert.ok(patternToRegExp("a.{b,c}").test("a.c") && !patternToRegExp("a.{b,c}").test("a.d"));
});

const check = (overrides: string[], configName = "ppo_trainer") => {
  const { defaults, raw } = loadConfigDetailed({ configName, overrides });
  return checkKeyKinds(defaults, raw);
};

test("honoured keys set by the user pass without a word", () => {
  const r = check(["actor_rollout_ref.actor.clip_ratio=0.3", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"]);
  assert.deepEqual(r, { inert: [], unread: [] });
  assert.equal(keyReportWarning(r), undefined);
});

test("inert keys set away from default are listed in one warning; at their default they are not", () => {
  const r = check([
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", // the default: not listed
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.model.use_shm=true",
  ]);
  assert.deepEqual(r.inert.map((i) => i.key).sort(), [
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.model.use_shm",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
  ]);
  const w = keyReportWarning(r)!;
  assert.match(w, /3 setting\(s\) have no effect/);
  assert.match(w, /gpu_memory_utilization=0\.6 \(vLLM\/SGLang\/TRT-LLM\)/);
  // an interpolated inert key whose source changed is not the user's setting
  assert.deepEqual(check(["actor_rollout_ref.rollout.n=8"]).inert, []);
});

test("not-built features set away from default fail in one error naming each feature", () => {
  assert.throws(
    () => check(["+reward_model.model.lora_rank=8", "actor_rollout_ref.actor.freeze_vision_tower=true"]),
    (e: unknown) =>
      e instanceof ConfigError && e.exitCode === 2 && /reward_model\.model\.lora_rank=8: LoRA is not built/.test(e.message) && /freeze_vision_tower=true: vision-language models is not built/.test(e.message),
  );
  // rollout skipping is built; verl's agent loop reads neither multi-turn key, so both are inert here
  const r = check([
    "actor_rollout_ref.rollout.skip_rollout=true", "actor_rollout_ref.rollout.skip_dump_dir=/tmp/x",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=true", "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2",
  ]);
  assert.deepEqual(r.inert.map((i) => i.key).sort(), [
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",
  ]);
  assert.match(keyReportWarning(r)!, /use_inference_chat_template=true \(nothing: verl's agent loop never reads it/);
  // Megatron's LoRA keys: the adapter's are honoured (its checkpoints read), Megatron-Bridge plumbing inert
  const meg = (o: string[]) => check(o, "ppo_megatron_trainer");
  assert.deepEqual(meg(["actor_rollout_ref.model.lora.rank=8", "actor_rollout_ref.model.lora.type=canonical_lora", "critic.model.lora.alpha=4"]), { inert: [], unread: [] });
  assert.deepEqual(meg(["actor_rollout_ref.model.lora.merge=true"]).inert.map((i) => i.key), ["actor_rollout_ref.model.lora.merge"]);
  assert.throws(() => meg(["critic.model.lora.freeze_vision_model=false"]), /vision-language models is not built/);
  // dropout, its position, DoRA and adapter_path (located and checked by readMegatronLora) are built
  assert.deepEqual(meg(["actor_rollout_ref.model.lora.dropout=0.1", "critic.model.lora.dropout_position=post", "actor_rollout_ref.model.lora.type=dora",
    "actor_rollout_ref.model.lora.adapter_path=/a"]), { inert: [], unread: [] });
  // LoRA and the memory switches are honoured on the actor and the critic
  assert.deepEqual(check(["actor_rollout_ref.model.lora_rank=8", "critic.model.lora_rank=4", "actor_rollout_ref.model.use_remove_padding=false"]), { inert: [], unread: [] });
  // multi-turn SFT and LoRA for SFT are honoured too
  assert.deepEqual(check(["data.multiturn.enable=true", "model.lora_rank=8"], "sft_trainer"), { inert: [], unread: [] });
});

test("keys added with + that nothing declares are warned about; declared ones are not", () => {
  const r = check(["+actor_rollout_ref.model.override_config.attention_dropout=0.0", "+trainer.my_flag=1"]);
  assert.deepEqual(r.unread, ["trainer.my_flag"]);
  assert.match(keyReportWarning(r)!, /added with '\+' are read by nothing[\s\S]*trainer\.my_flag/);
});

test("Hydra's + rule: allowed over null and over verl-ts's own keys, refused over verl's set keys", () => {
  const sft = loadConfig({ configName: "sft_trainer", overrides: ["+data.response_dict_keys=['answer']"] });
  assert.deepEqual(getPath(sft, "data.response_dict_keys"), ["answer"]);
  const ppo = loadConfig({ configName: "ppo_trainer", overrides: ["data.train_batch_size=16", "+data.gen_batch_size=48"] });
  assert.equal(getPath(ppo, "data.gen_batch_size"), 48);
  assert.throws(() => loadConfig({ configName: "ppo_trainer", overrides: ["+data.train_batch_size=8"] }), /already exists/);
});

test("every unknown key comes back in one error, each with suggestions from its own section", () => {
  assert.throws(
    () => loadConfig({ configName: "ppo_trainer", overrides: ["actor_rollout_ref.rollout.enforce_eagr=true", "actor_rollout_ref.actor.optim.lrr=1", "~critic.nope"] }),
    (e: unknown) => {
      const m = (e as Error).message;
      assert.ok(e instanceof ConfigError && e.exitCode === 2);
      assert.match(m, /3 overrides name keys that are not in the config/);
      assert.match(m, /enforce_eagr=true\): the key is not in the config; did you mean actor_rollout_ref\.rollout\.enforce_eager\?/);
      assert.doesNotMatch(m, /ignore_eos/);
      assert.match(m, /optim\.lrr=1\): the key is not in the config; did you mean actor_rollout_ref\.actor\.optim\.lr\?/);
      assert.match(m, /~critic\.nope/);
      return true;
    },
  );
});

test("the reward model's input_tokenizer, override_config, sandbox_fusion, reward loop and served reward-model keys are honoured keys, not refused", () => {
  assert.deepEqual(check(["reward_model.model.input_tokenizer=null", "+reward_model.model.override_config.hidden_size=8"]), { inert: [], unread: [] });
  assert.deepEqual(check(["reward_model.model.input_tokenizer=/models/rm-tokenizer"]), { inert: [], unread: [] });
  // verl's Skywork reward-model example: the engine settings are plumbing, the name and max_model_len are read
  // (response_length too: a generative reward model's default max_tokens)
  const served = check(["reward_model.enable=True", "reward_model.use_reward_loop=True", "reward_model.rollout.name=vllm", "reward_model.rollout.gpu_memory_utilization=0.8",
    "reward_model.rollout.tensor_model_parallel_size=1", "reward_model.rollout.prompt_length=8192", "reward_model.rollout.response_length=4096", "reward_model.rollout.max_model_len=12288"]);
  assert.deepEqual(served.inert.map((i) => i.key).sort(), ["reward_model.rollout.gpu_memory_utilization", "reward_model.rollout.prompt_length", "reward_model.rollout.tensor_model_parallel_size"]);
  assert.deepEqual(check(["reward_model.reward_loop_source=importlib", "reward_model.reward_loop_module_path=loop.ts", "reward_model.reward_loop_class_name=MyLoop"]), { inert: [], unread: [] });
  assert.deepEqual(check(["reward_model.sandbox_fusion.url=http://127.0.0.1:8080/run_code", "reward_model.sandbox_fusion.max_concurrent=8", "reward_model.sandbox_fusion.memory_limit_mb=512"]), { inert: [], unread: [] });
});
