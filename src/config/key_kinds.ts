// What verl-ts does with each config key, declared once: the CLI checks against it before a run,
// docs/configuration.md's tables are generated from it (scripts/config-doc.mjs), and
// test/config/key_kinds.test.ts holds every composed leaf to having a kind.
//   honoured   read by verl-ts's code
//   inert      accepted so verl's scripts run unchanged, but plumbing of verl's distributed engines
//              (vLLM/SGLang/TRT-LLM, FSDP, Megatron, profilers, Ray, NCCL) with no meaning here;
//              one warning at start lists those set away from their default
//   not_built  a verl feature verl-ts does not have: setting it away from its default is an error
// Patterns: dotted keys; `*` is one segment, `**` any number (at least one), `{a,b}` alternatives.
// The first rule that matches a key decides. `own: true` marks keys verl-ts adds beyond verl's schema
// (a verl script's `+key=...` may still set those).

export type KeyKind = "honoured" | "inert" | "not_built";

export interface KeyRule {
  keys: string;
  kind: KeyKind;
  /** honoured: what reads it; inert: whose plumbing it is; not_built: the feature's name. */
  what: string;
  /** For names the code dispatches on: the accepted values. */
  values?: readonly string[];
  own?: true;
}

const A = "actor_rollout_ref.actor", R = "actor_rollout_ref.rollout", M = "actor_rollout_ref.model", REF = "actor_rollout_ref.ref";
const OPTIM = "{betas,clip_grad,lr,lr_scheduler_type,lr_warmup_steps,lr_warmup_steps_ratio,min_lr_ratio,num_cycles,optimizer,total_training_steps,weight_decay,warmup_style}";

/** rollout.name: the built-in engines (src/rollout/engines); more come through registerRolloutEngine. */
export const ROLLOUT_NAMES = ["tfjs", "hf", "naive", "vllm", "sglang", "webgpu", "llama_cpp"] as const;
/** actor/critic strategy: verl's names, each trained here as data parallel over worker threads. */
export const STRATEGIES = ["dp", "fsdp", "fsdp2", "megatron"] as const;

export const KEY_RULES: readonly KeyRule[] = [
  // --- honoured: PPO -------------------------------------------------------------------------
  { keys: `${A}.optim.${OPTIM}`, kind: "honoured", what: "the actor's optimizer and LR schedule" },
  { keys: `${A}.policy_loss.{clip_cov_lb,clip_cov_ratio,clip_cov_ub,kl_cov_ratio,loss_mode,ppo_kl_coef}`, kind: "honoured", what: "the policy loss" },
  // A registered policy loss reads its own keys from config.policy_loss (docs/extending.md: kl_beta).
  { keys: `${A}.policy_loss.**`, kind: "honoured", what: "passed to the policy loss (a registered loss reads its own keys)" },
  {
    keys: `${A}.{calculate_entropy,calculate_sum_pi_squared,clip_ratio,clip_ratio_c,clip_ratio_high,clip_ratio_low,entropy_coeff,grad_clip,kl_loss_coef,kl_loss_type,loss_agg_mode,loss_scale_factor,ppo_epochs,ppo_max_token_len_per_gpu,ppo_micro_batch_size,ppo_micro_batch_size_per_gpu,ppo_mini_batch_size,shuffle,tau_neg,tau_pos,use_dynamic_bsz,use_kl_loss}`,
    kind: "honoured",
    what: "the actor update",
  },
  { keys: "{actor_rollout_ref.actor,critic,actor_rollout_ref.ref,reward_model}.strategy", kind: "honoured", what: "every strategy trains as data parallel over worker threads", values: STRATEGIES },
  { keys: `{${M},critic.model}.{external_lib,path,tokenizer_path}`, kind: "honoured", what: "model loading" },
  { keys: `{${M},critic.model,model}.hf_config_path`, kind: "honoured", what: "model loading (the folder whose config.json describes the weights)" },
  { keys: `{${M},critic.model,reward_model.model,model}.override_config.moe_config.**`, kind: "inert", what: "Megatron MoE settings (verl-ts reads a MoE model's experts from its config.json: Qwen3-MoE)" },
  { keys: `{${M},critic.model,reward_model.model}.override_config.**`, kind: "honoured", what: "the architecture of a scratch model (a loaded checkpoint refuses overrides)" },
  { keys: `{${M},critic.model,reward_model.model}.override_config`, kind: "honoured", what: "the architecture of a scratch model (a loaded checkpoint refuses overrides)" },
  { keys: "model.override_config.**", kind: "honoured", what: "the architecture of a scratch SFT model (model.partial_pretrain=scratch)" },
  { keys: "model.override_config", kind: "honoured", what: "the architecture of a scratch SFT model (model.partial_pretrain=scratch)" },
  { keys: `${REF}.{log_prob_max_token_len_per_gpu,log_prob_micro_batch_size,log_prob_micro_batch_size_per_gpu,log_prob_use_dynamic_bsz}`, kind: "honoured", what: "reference log-probs" },
  { keys: `${R}.agent.max_concurrent_loops`, kind: "honoured", what: "the agent loop", own: true },
  { keys: `${R}.agent.{agent_loop_config_path,default_agent_loop,num_workers}`, kind: "honoured", what: "the agent loop" },
  {
    keys: `${R}.multi_turn.{enable,format,interaction_config_path,max_assistant_turns,max_parallel_calls,max_tool_response_length,max_user_turns,tool_config_path,tool_response_truncate_side}`,
    kind: "honoured",
    what: "multi-turn rollout",
  },
  { keys: `${R}.val_kwargs.{do_sample,n,temperature,top_k,top_p}`, kind: "honoured", what: "validation sampling" },
  { keys: `{${R},rollout}.name`, kind: "honoured", what: "the rollout engine (tfjs/hf/naive: host decoder; webgpu: GPU decoder; vllm/sglang: the GPU decoder on a WebGPU rank, else the host; llama_cpp)", values: ROLLOUT_NAMES },
  { keys: `${R}.seed_per_sample`, kind: "honoured", what: "sampling", own: true },
  {
    keys: `${R}.{calculate_log_probs,do_sample,ignore_eos,log_prob_max_token_len_per_gpu,log_prob_micro_batch_size,log_prob_micro_batch_size_per_gpu,log_prob_use_dynamic_bsz,max_num_seqs,n,prompt_length,response_length,temperature,top_k,top_p}`,
    kind: "honoured",
    what: "generation",
  },
  { keys: "algorithm.kl_ctrl.{horizon,kl_coef,target_kl,type}", kind: "honoured", what: "the KL controller" },
  { keys: "algorithm.{adv_estimator,gamma,kl_penalty,lam,norm_adv_by_std_in_grpo,use_kl_in_reward,use_pf_ppo}", kind: "honoured", what: "advantages and KL" },
  { keys: "algorithm.pf_ppo.{reweight_method,weight_pow}", kind: "honoured", what: "PF-PPO resampling" },
  { keys: `critic.optim.${OPTIM}`, kind: "honoured", what: "the critic's optimizer and LR schedule" },
  {
    keys: "critic.{cliprange_value,enable,forward_max_token_len_per_gpu,forward_micro_batch_size,forward_micro_batch_size_per_gpu,grad_clip,loss_agg_mode,ppo_epochs,ppo_max_token_len_per_gpu,ppo_micro_batch_size,ppo_micro_batch_size_per_gpu,ppo_mini_batch_size,shuffle,use_dynamic_bsz}",
    kind: "honoured",
    what: "the critic update",
  },
  { keys: "{custom_reward_function,reward_model}.reward_kwargs", kind: "honoured", what: "reward functions", own: true },
  { keys: "{custom_reward_function,reward_model}.reward_kwargs.**", kind: "honoured", what: "reward functions", own: true },
  { keys: "custom_reward_function.{name,path}", kind: "honoured", what: "reward functions" },
  { keys: "reward_model.overlong_buffer.{enable,len,log,penalty_factor}", kind: "honoured", what: "DAPO's overlong penalty", own: true },
  { keys: "reward_model.{enable,forward_max_token_len_per_gpu,max_length,micro_batch_size,micro_batch_size_per_gpu,reward_manager,use_dynamic_bsz}", kind: "honoured", what: "rewards" },
  { keys: "reward_model.model.{path,external_lib}", kind: "honoured", what: "the reward model" },
  { keys: "reward_model.{reward_loop_source,reward_loop_module_path,reward_loop_class_name,use_reward_loop}", kind: "honoured", what: "a reward loop class from a JS/TS module, in place of the reward manager (src/reward/reward_loop.ts)" },
  { keys: "reward_model.rollout.{name,max_model_len}", kind: "honoured", what: "the reward model as verl's reward loop serves it: discriminative (scored in verl-ts's reward-model worker; src/workers/rm_chat_template.ts) or, with custom_reward_function.path, generative (served over HTTP on 127.0.0.1 for the function to query: src/reward/reward_model_server.ts)", values: ["vllm", "sglang"] },
  { keys: "reward_model.rollout.{temperature,top_p,top_k,response_length,max_num_seqs}", kind: "honoured", what: "a generative reward model's server: the sampling a request leaves out (verl's override_generation_config; max_tokens = response_length) and its cache slots (at most one step's rows)" },
  { keys: "reward_model.rollout.**", kind: "inert", what: "vLLM/SGLang serving verl's reward model (verl-ts serves it with its own decoder)" },
  { keys: "reward_model.sandbox_fusion.{url,max_concurrent,memory_limit_mb}", kind: "honoured", what: "the Sandbox Fusion code-execution reward for codecontests/apps/codeforces/taco (src/reward/sandbox_fusion.ts)" },
  { keys: "reward_model.model.input_tokenizer", kind: "honoured", what: "the reward model re-renders each conversation with its own chat template (src/workers/rm_chat_template.ts)" },
  { keys: "reward_manager.{name,source}", kind: "honoured", what: "rewards (verl's newer spelling of reward_model.reward_manager)" },
  { keys: "reward_manager.module.{path,name}", kind: "honoured", what: "a reward manager from a JS module (source=importlib)" },
  { keys: "{**.,}optim.override_optimizer_config{,.**}", kind: "honoured", what: "AdamW's keywords (lr, weight_decay, betas, eps, Megatron's adam_*; src/workers/dp_optimizer.ts)" },
  { keys: `${A}.use_prefix_grouper`, kind: "inert", what: "PyTorch kernels and memory savers (same results here): the group's shared prompt prefix computed once" },
  // --- honoured: data (RL and SFT) -------------------------------------------------------------
  { keys: "data.gen_batch_size", kind: "honoured", what: "DAPO's dynamic sampling", own: true },
  { keys: "data.apply_chat_template_kwargs.**", kind: "honoured", what: "chat templates" },
  { keys: "{**.,}custom_chat_template", kind: "honoured", what: "the chat template every prompt is rendered with (replaces the tokenizer's)" },
  { keys: "data.chat_template", kind: "honoured", what: "the SFT chat template (replaces the tokenizer's; verl's legacy SFT trainer refuses it)" },
  {
    keys: "data.{apply_chat_template_kwargs,batch_size,data_source_key,filter_overlong_prompts,max_length,max_prompt_length,max_response_length,micro_batch_size_per_gpu,n_samples,output_path,path,prompt_dict_keys,prompt_key,response_dict_keys,response_key,return_raw_chat,reward_fn_key,reward_model_key,seed,shuffle,tool_config_path,train_batch_size,train_files,train_max_samples,truncation,val_batch_size,val_files,val_max_samples,validation_shuffle}",
    kind: "honoured",
    what: "data loading",
  },
  // --- honoured: SFT, generation, evaluation -----------------------------------------------------
  { keys: "data.multiturn.{enable,enable_thinking_key,messages_key,tools_key}", kind: "honoured", what: "multi-turn SFT (src/trainer/sft/multiturn_sft_dataset.ts)" },
  { keys: "data.{messages_key,tools_key,enable_thinking_key,ignore_input_ids_mismatch,pad_mode}", kind: "honoured", what: "multi-turn SFT (sft_trainer_engine; pad_mode right and no_padding give the same loss here)" },
  { keys: "data.{use_dynamic_bsz,max_token_len_per_gpu}", kind: "honoured", what: "SFT micro-batches by token budget (sft_trainer_engine)" },
  { keys: "model.tokenizer_path", kind: "honoured", what: "model loading", own: true },
  { keys: "model.{external_lib,partial_pretrain,path}", kind: "honoured", what: "model loading" },
  { keys: "optim.{betas,clip_grad,lr,lr_scheduler,lr_warmup_steps_ratio,weight_decay,min_lr_ratio,num_cycles,optimizer,warmup_style}", kind: "honoured", what: "the SFT optimizer" },
  { keys: "optim.{lr_scheduler_type,lr_warmup_steps}", kind: "honoured", what: "the SFT optimizer (sft_trainer_engine; the legacy sft_trainer reads optim.lr_scheduler)" },
  { keys: "optim.total_training_steps", kind: "inert", what: "the SFT trainer (set from the step count)" },
  { keys: "rollout.{do_sample,n,prompt_length,response_length,temperature,top_k,top_p}", kind: "honoured", what: "offline generation" },
  { keys: "rollout.{log_prob_micro_batch_size_per_gpu,max_num_seqs}", kind: "inert", what: "offline generation (verl-ts decodes data.batch_size prompts together and computes no log-probs)" },
  { keys: "trainer.{seed,log_level}", kind: "honoured", what: "the trainer", own: true },
  { keys: "trainer.{heartbeat_timeout,max_consecutive_skipped_steps,rank_heap_limit_mb}", kind: "honoured", what: "fault handling (stuck ranks, skipped steps)", own: true },
  { keys: "trainer.{collective_timeout,keepalive_s}", kind: "honoured", what: "runs spanning hosts (collective and keepalive timeouts)", own: true },
  { keys: "actor_rollout_ref.nccl_timeout", kind: "honoured", what: "the collective timeout across hosts when trainer.collective_timeout is null" },
  {
    keys: "trainer.{balance_batch,critic_warmup,default_local_dir,del_local_ckpt_after_load,device,experiment_name,log_val_generations,logger,max_actor_ckpt_to_keep,max_ckpt_to_keep,max_critic_ckpt_to_keep,n_gpus_per_node,nnodes,project_name,resume_from_path,resume_mode,rollout_data_dir,save_freq,test_freq,total_epochs,total_training_steps,val_before_train,val_only,validation_data_dir}",
    kind: "honoured",
    what: "the trainer",
  },

  // --- not built: verl features verl-ts does not have ---------------------------------------------
  { keys: `{${M},critic.model,model}.{lora_rank,lora_alpha,target_modules,exclude_modules,lora_adapter_path}`, kind: "honoured", what: "LoRA (src/models/lora.ts; SFT and PPO alike)" },
  { keys: `{${M},critic.model}.{enable_gradient_checkpointing,use_remove_padding}`, kind: "honoured", what: "training memory (gradient checkpointing, packed rows)" },
  { keys: "model.enable_gradient_checkpointing", kind: "honoured", what: "training memory (gradient checkpointing)" },
  {
    keys: `{${M},critic.model}.lora.{type,rank,alpha,target_modules,exclude_modules,lora_A_init_method,lora_B_init_method}`,
    kind: "honoured",
    what: "LoRA from Megatron's keys on the PEFT layout (src/workers/megatron_lora.ts; fused linear_qkv/linear_fc1 as tied adapters sharing A; type=dora is DoRA with a trained magnitude, exported as peft's use_dora; vlm_lora refused at start)",
  },
  {
    keys: `{${M},critic.model}.lora.{dropout,dropout_position}`,
    kind: "honoured",
    what: "dropout on the adapter branch in the update's forward only (not the rollout nor the log-prob/value passes, which verl runs in eval mode); pre: on the adapter's input, post: on its output; seeded (src/models/lora_dropout.ts)",
  },
  { keys: `{${M},critic.model}.lora.{merge,dtype,a2a_experimental}`, kind: "inert", what: "Megatron-Bridge (the rollout always decodes with the adapter merged in: the same numbers as separate adapters; adapters are float32)" },
  {
    keys: `{${M},critic.model}.lora.adapter_path`,
    kind: "honoured",
    what: "the adapter starts from this checkpoint: verl's <path>/mp_rank_00_adapter.pt or a Megatron-Bridge torch_dist folder (.metadata + .distcp), read without torch (src/workers/megatron_adapter.ts) and checked against lora.rank and the model; several model-parallel ranks' files are refused, and a peft folder goes in model.lora_adapter_path",
  },
  { keys: `{${M},critic.model}.lora.{freeze_vision_model,freeze_vision_projection,freeze_language_model}`, kind: "not_built", what: "vision-language models" },
  { keys: "**.{lora_rank,lora_alpha,target_modules,exclude_modules,lora_adapter_path}", kind: "not_built", what: "LoRA" },
  { keys: "**.lora.**", kind: "not_built", what: "LoRA (Megatron)" },
  { keys: `${A}.router_replay.mode`, kind: "honoured", what: "MoE routing replay: R2 records the experts in the old-log-prob pass, R3 in the rollout; the update replays them (docs/models.md)", values: ["disabled", "R2", "R3"] },
  { keys: `${A}.router_replay.{record_file,replay_file}`, kind: "inert", what: "nothing: verl's code never reads them either (the routing travels in the batch as routed_experts)" },
  { keys: `${REF}.router_replay.**`, kind: "inert", what: "nothing: verl reads only the actor's router_replay (the reference policy routes on its own)" },
  { keys: `${R}.enable_rollout_routing_replay`, kind: "honoured", what: "MoE routing replay: the rollout records routed_experts (host decoder; docs/models.md)" },
  { keys: `${M}.mtp.{enable,enable_train,enable_rollout,detach_encoder,mtp_loss_scaling_factor,method,num_speculative_tokens}`, kind: "honoured", what: "multi-token prediction for MiMo (model.mtp_layers.*): enable loads and saves the MTP layers, enable_train adds the MTP loss to the actor's, enable_rollout drafts with the MTP layer on the host decoder, single-turn and agent loops (method mtp; num_speculative_tokens drafts a step, the one MTP layer chained as vLLM does; src/workers/mtp_settings.ts, docs/models.md)" },
  { keys: `${M}.mtp.{speculative_algorithm,speculative_num_steps,speculative_eagle_topk,speculative_num_draft_tokens}`, kind: "inert", what: "SGLang's EAGLE speculative-decoding settings" },
  { keys: `${R}.mtp`, kind: "inert", what: "the rollout's view of actor_rollout_ref.model.mtp, which verl-ts reads" },
  { keys: "algorithm.rollout_correction.**", kind: "honoured", what: "rollout correction (src/trainer/ppo/rollout_corr.ts; bypass_mode's loss in core_algos/policy_loss_bypass.ts)" },
  { keys: `${R}.over_sample_rate`, kind: "honoured", what: "agent-loop rollouts: the rest of a training batch is aborted once (1 - over_sample_rate) of its requests finished (src/agent_loop/manager.ts)" },
  { keys: `${R}.dtype`, kind: "honoured", what: "the WebGPU decoder's products (bf16/fp16: tensor cores; default float32 here; the agent loops' slot decoder too, with an f16 KV cache; docs/gpu.md): src/rollout/engines/webgpu.ts" },
  { keys: `${R}.{skip_rollout,skip_dump_dir}`, kind: "honoured", what: "rollout skipping: the first training rollout dumped, then loaded by every step (src/trainer/ppo/rollout_skip.ts)" },
  { keys: `${R}.quantization`, kind: "honoured", what: "quantized rollout, its numerics without its speed: fp8 rounds the linear weights to float8 e4m3 with 128 x 128 block scales at each weight sync, their inputs per token in groups of 128 (src/rollout/fp8.ts); torchao applies the scheme of quantization_config_file as vLLM's online quantization does (src/rollout/torchao.ts)", values: ["fp8", "torchao"] },
  { keys: `${R}.quantization_config_file`, kind: "honoured", what: "fp8: the file's weight_block_size; torchao: the scheme, torchao's config_to_dict JSON (Float8DynamicActivationFloat8WeightConfig PerRow, Int8WeightOnlyConfig, Int4WeightOnlyConfig; others refused by name)" },
  { keys: "**.freeze_vision_tower", kind: "not_built", what: "vision-language models" },
  { keys: "data.custom_cls.{path,name}", kind: "honoured", what: "the user's dataset class in RLHFDataset's place: a JS/TS module, or verl's Python class run in python3 (src/data/python_bridge.ts; needs transformers there for the tokenizer)" },
  { keys: "data.dataloader_num_workers", kind: "honoured", what: "checked only: a data.sampler needs 0, as verl asserts (verl-ts reads rows on the training thread)" },
  { keys: "data.trust_remote_code", kind: "honoured", what: "passed to AutoTokenizer.from_pretrained for a Python data.custom_cls" },
  { keys: "data.python_timeout_s", kind: "honoured", what: "seconds each call into a Python data.custom_cls / data.sampler class may take before its process is killed (default 300): building it, update(), state_dict(), and each row's __getitem__ / each index's next() of a batch's one batched call, the clock restarting at every row or index (so a batch of N rows may take N times it, but one hung row is cut off after it, named by its index)", own: true },
  { keys: "data.datagen.**", kind: "honoured", what: "passed to the data.custom_cls class with the rest of data (verl's own reader of it, DynamicGenDataset, is such a class)" },
  { keys: "data.sampler.{class_path,class_name}", kind: "honoured", what: "the user's sampler class, JS/TS or verl's Python AbstractSampler run in python3 (update(batch) after each step for curriculum samplers; needs data.dataloader_num_workers=0 as in verl): src/data/dataloader.ts" },

  // --- inert: plumbing of verl's engines ---------------------------------------------------------------
  {
    keys: "actor_rollout_ref.{actor,ref}.fsdp_config.mixed_precision.{param_dtype,reduce_dtype,buffer_dtype}",
    kind: "honoured",
    what: "16-bit matrix products on WebGPU's tensor cores (param_dtype; reduce/buffer fp32 only): src/engine/webgpu_kernels.ts",
  },
  {
    keys: `{${A}.fsdp_config,critic.model.fsdp_config,engine}.fsdp_size`,
    kind: "honoured",
    what: "optimizer state sharding (ZeRO-1) as FSDP shards it: -1 or >= world size over all ranks, k over groups of k ranks (hybrid), 1 replicated (src/workers/optimizer_sharding.ts; docs/distributed.md)",
  },
  {
    keys: `{${A}.megatron,critic.megatron,engine}.use_distributed_optimizer`,
    kind: "honoured",
    what: "strategy megatron: optimizer state sharded over all ranks (true) or replicated (false) (src/workers/optimizer_sharding.ts)",
  },
  { keys: "**.fsdp_config.**", kind: "inert", what: "FSDP" },
  { keys: "{**.,}megatron.**", kind: "inert", what: "Megatron-LM" },
  { keys: "engine.**", kind: "inert", what: "verl's training engines (FSDP/Megatron/VeOmni)" },
  { keys: "{**.,}{profiler,global_profiler}.**", kind: "inert", what: "profilers" },
  { keys: "trainer.profile_interval", kind: "inert", what: "profilers" },
  { keys: "{ray_kwargs,transfer_queue}.**", kind: "inert", what: "Ray" },
  { keys: "actor_rollout_ref.hybrid_engine", kind: "inert", what: "Ray/NCCL" },
  { keys: "trainer.{esi_redundant_time,default_hdfs_dir,ray_wait_register_center_timeout,use_legacy_worker_impl}", kind: "inert", what: "Ray/HDFS plumbing" },
  { keys: "reward_model.{enable_resource_pool,n_gpus_per_node,nnodes,num_workers,launch_reward_fn_async}", kind: "inert", what: "Ray resource pools" },
  {
    keys: `{${R},rollout}.{mode,dtype,gpu_memory_utilization,enforce_eager,cudagraph_capture_sizes,free_cache_engine,load_format,tensor_model_parallel_size,data_parallel_size,expert_parallel_size,pipeline_model_parallel_size,max_num_batched_tokens,max_model_len,enable_chunked_prefill,enable_prefix_caching,logprobs_mode,scheduling_policy,disable_log_stats,multi_stage_wake_up,skip_tokenizer_init,layered_summon,log_prob_micro_batch_size,calculate_log_probs,ignore_eos}`,
    kind: "inert",
    what: "vLLM/SGLang/TRT-LLM",
  },
  { keys: `${R}.engine_kwargs.llama_cpp.**`, kind: "honoured", what: "the llama_cpp rollout engine", own: true },
  { keys: `${R}.{engine_kwargs,checkpoint_engine,prometheus,trace,layer_name_map}.**`, kind: "inert", what: "vLLM/SGLang/TRT-LLM" },
  { keys: `${R}.engine_kwargs`, kind: "inert", what: "vLLM/SGLang/TRT-LLM" },
  { keys: `${R}.multi_turn.tokenization_sanity_check_mode`, kind: "inert", what: "SGLang" },
  // verl's agent loop never reads these: only the SGLang SPMD rollout did (retired in verl #4422), and
  // num_repeat_rollouts only CollabLLM's recipe (now in verl-recipe). As in verl's agent loop, every
  // turn here is generated from the conversation's recorded token ids (reasoning kept in history).
  { keys: `${R}.multi_turn.use_inference_chat_template`, kind: "inert", what: "nothing: verl's agent loop never reads it (only its retired SGLang SPMD rollout did); every turn is generated from the recorded token ids, as in verl" },
  { keys: `${R}.multi_turn.num_repeat_rollouts`, kind: "inert", what: "nothing: verl's code never reads it (only the CollabLLM recipe, outside verl, does)" },
  // verl declares agent.custom_async_server (CustomAsyncServerConfig) but no code of verl's reads it (checked at
  // verl's HEAD of 2026-01-29): its servers come from rollout.name. Custom engines here: registerRolloutEngine.
  { keys: `${R}.agent.custom_async_server.**`, kind: "inert", what: "nothing: verl declares it but no code of verl's reads it (a custom engine here: registerRolloutEngine, docs/gpu.md, Rollout engines)" },
  {
    keys: "**.{use_shm,trust_remote_code,enable_gradient_checkpointing,enable_activation_offload,use_remove_padding,use_liger,use_fused_kernels,use_torch_compile,ulysses_sequence_parallel_size,entropy_from_logits_with_chunking,entropy_checkpointing,sum_pi_squared_checkpointing,rollout_n}",
    kind: "inert",
    what: "PyTorch kernels and memory savers (same results here)",
  },
  { keys: "**.{fused_kernel_options,tiled_mlp}.**", kind: "inert", what: "PyTorch kernels and memory savers (same results here)" },
  { keys: "{**.,}checkpoint.{save_contents,load_contents,async_save}", kind: "inert", what: "checkpoint contents (verl-ts always saves model, optimizer and extra state)" },
  { keys: "{**.,}shuffle", kind: "inert", what: "mini-batch shuffling (verl reads it only in its Megatron workers)" },
  { keys: "{**.,}data_loader_seed", kind: "inert", what: "the mini-batch shuffle's seed (verl-ts seeds the actor's and critic's shuffles from trainer.seed and the rank)" },
  { keys: "{**.,}optim.optimizer_impl", kind: "inert", what: "the PyTorch optimizer module" },
  {
    keys: "{**.,}optim.{lr_decay_steps,lr_decay_style,lr_warmup_init,lr_wsd_decay_steps,lr_wsd_decay_style,min_lr,use_checkpoint_opt_param_scheduler,weight_decay_incr_style,clip_grad_norm}",
    kind: "inert",
    what: "Megatron-LM's optimizer scheduler",
  },
  { keys: "**.{load_weight,nccl_timeout}", kind: "inert", what: "Megatron-LM/NCCL" },
  { keys: "data.{use_shm,return_raw_input_ids,return_full_prompt,filter_overlong_prompts_workers,image_patch_size,image_key,video_key,return_multi_modal_inputs,micro_batch_size}", kind: "inert", what: "PyTorch data loading" },
  { keys: "data.tokenizer", kind: "inert", what: "nothing: verl's code never reads it either (the model's tokenizer is used)" },
  { keys: "data.balance_dp_token", kind: "inert", what: "SFT loss normalisation (verl-ts always divides by the token count of the whole global batch)" },
  { keys: "model.strategy", kind: "inert", what: "FSDP" },
  { keys: "{ulysses_sequence_parallel_size,use_remove_padding}", kind: "inert", what: "PyTorch kernels and memory savers (same results here)" },
  { keys: "{actor,ray_init}.**", kind: "inert", what: "verl's generation worker plumbing" },
];

/** A glob of KEY_RULES as a regular expression over dotted keys. */
export function patternToRegExp(pattern: string): RegExp {
  let re = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "*" && pattern[i + 1] === "*") {
      re += "[^.]+(?:\\.[^.]+)*";
      i++;
    } else if (c === "*") re += "[^.]+";
    else if (c === "{") re += "(?:";
    else if (c === "}") re += ")";
    else if (c === ",") re += "|";
    else re += c.replace(/[.+?^$()|[\]\\]/g, "\\$&");
  }
  return new RegExp(`^${re}$`);
}

const compiled = KEY_RULES.map((rule) => ({ rule, re: patternToRegExp(rule.keys) }));

/** The rule that declares `key`, or undefined. */
export function ruleFor(key: string): KeyRule | undefined {
  return compiled.find((c) => c.re.test(key))?.rule;
}
