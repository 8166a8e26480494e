#!/usr/bin/env bash
# The device session behind docs/gpu.md's "Tensor cores" section (issue 23), one call on the GPU
# machine after `bash scripts/gpu-bundle.sh` here (carry [".gpu", ".gl"]; the PyTorch script runs
# from the repository, the verl-ts side from the bundle):
#   OUT=/tmp/s bash bench/gpu_tensor_core_session.sh       (about 6 minutes)
# A. bench/gpu_gemm.ts: identity/edge debug cases, Dawn validation on, 50 checks, the direct-kernel
#    sweep at 4096^3, the registered kernel at the model's shapes
# B. bench/gpu_decode.ts: actor update 64 x 96 and rollout 512 x 256 (vocab 512, 151,936), f32 and f16 products
# C. bench/pytorch_gpu_table.py: the same shapes in PyTorch on the same GPU
# D. GRPO, stories260K and the 0.5B shape, with and without fsdp_config.mixed_precision.param_dtype=bf16
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p $O
G="bash scripts/gpu-run.sh node dist/bench/gpu_gemm.js"
run() { local name=$1 lim=$2; shift 2; local t=$SECONDS; timeout $lim "$@" > $O/$name.log 2>&1; echo "== $name: exit $? $((SECONDS-t))s"; }
run debug 60 $G --only debug
grep '"debug' $O/debug.log | cut -c1-400; grep -i "error\|fault" $O/debug.log | head -5 | cut -c1-300
run validate 60 env VERL_DAWN_FLAGS=enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia,vulkan_use_cooperative_matrix_robust_access $G --only validate
grep '"validate"' $O/validate.log | cut -c1-400
run check 90 $G --only check
python3 - $O/check.log <<'PY'
import sys,json
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"name":"check')]
bad=[r for r in rows if not r['figures'].get('ok', True)]
print('checks', len(rows), 'bad', len(bad), 'max rel', max((r['figures'].get('rel',0) for r in rows), default=None))
for r in bad[:8]: print(r['config'], r['figures'])
for r in rows:
  if 'rounding' in r['config']: print(r['config'], r['figures'])
PY
run direct 150 $G --only direct --reps 20
run registry 100 $G --only registry --reps 10 --direct ${DTILE:-2x2x4x4x1}
cat $O/direct.log $O/registry.log | python3 -c "
import sys,json
for l in sys.stdin:
  if not l.startswith('{'):
    if 'rror' in l or 'ault' in l: print(l[:300].rstrip())
    continue
  r=json.loads(l); c,f=r['config'],r['figures']
  if 'error' in f: print(r['name'], f['error'][:400]); continue
  if r['name']=='sweep_direct': t=c['tile']; print('direct %dx%d sg, %dx%d frags, u%d' % (t['sgM'],t['sgN'],t['tm'],t['tn'],t['unroll']), ('T' if c['transposeA'] else 'N')+('T' if c['transposeB'] else 'N'), '%.3f ms %.1f TFLOP/s rel %.2e' % (f['ms'], f['tflops'], f['rel']))
  elif r['name']=='registry': print('registry', c['name'], c['m'], c['n'], c['k'], '%.1f TFLOP/s (f32 %.1f, x%.2f) rel %.2e calls %d' % (f['tensor_core_tflops'], f['f32_tflops'], f['speedup'], f['rel'], f['tensor_core_calls']))
"
run table 300 bash scripts/gpu-run.sh node dist/bench/gpu_decode.js --only adapter,update,decode --updates 64x64 --submit 0 --precision f32,f16 --vocab 512,151936 --budget-s 260
grep '^{' $O/table.log | python3 -c "
import sys,json
for l in sys.stdin:
  r=json.loads(l); c,f=r['config'],r['figures']
  if 'error' in f: print(r['name'], f['error'][:500]); continue
  if r['name'].startswith('update'): print(r['name'], c.get('matmul'), 'calls', c.get('tensor_core_calls'), '%.0f ms %.0f tok/s %.1f TFLOP/s fwd %.0f ms' % (f['ms'], f['tokens_per_s'], f['tflops'], f['forward_only_ms']))
  elif r['name'].startswith('webgpu_decode'): print(r['name'], c.get('matmul'), '%.0f tok/s wall %.1f s prefill %.0f ms step %.1f ms' % (f['tokens_per_s'], f['wall_ms']/1e3, f['prefill_ms'], f['ms_per_step']))
  elif r['name'] in ('webgpu','done','precision_f16'): print(json.dumps(f)[:300])
"
run pytorch 220 python3 bench/pytorch_gpu_table.py
cut -c1-400 $O/pytorch.log
VERL="bash $PWD/scripts/gpu-run.sh verl"
MP=(+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16 +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16)
summary() {
  python3 - "$1" <<'PY'
import json, sys
try: lines = open(sys.argv[1]).read().splitlines()
except OSError as e: print("no metrics:", e); sys.exit(0)
for line in lines:
    m = json.loads(line); d = m.get("data", m)
    t = {k[9:]: round(v, 2) for k, v in d.items() if k.startswith("timing_s/") and k[9:] in ("step","gen","old_log_prob","ref","update_actor")}
    keep = ["critic/score/mean", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "rollout_corr/kl"]
    print(f"step {m.get('step')}:", " ".join(f"{k}={v}" for k, v in sorted(t.items())), "|", " ".join(f"{k.split('/')[-1]}={d.get(k):.6g}" for k in keep if k in d))
PY
}
stories() { local name=$1; shift; local t=$SECONDS
  OUT=$O/$name STEPS=5 VERL="$VERL" MODEL_PATH=.gpu/stories260K/stories260K.bin timeout 80 bash recipes/stories_grpo/run.sh custom_reward_function.path=$PWD/.gpu/reward.mjs \
    trainer.n_gpus_per_node=1 trainer.device=webgpu trainer.val_before_train=False trainer.test_freq=-1 "$@" > $O/$name.log 2>&1
  echo "== $name: exit $? $((SECONDS-t))s"; grep "\[verl-ts\] actor" $O/$name.log | head -2 | cut -c1-250; summary $O/$name/metrics.jsonl; }
qwen() { local name=$1; shift; local t=$SECONDS
  OUT=$O/$name STEPS=5 ROLLOUT=webgpu VERL="$VERL" TOKENIZER=$PWD/.gpu/stories260K/tok512.bin timeout 120 bash recipes/qwen05b_shape_grpo/run.sh custom_reward_function.path=$PWD/.gpu/reward.mjs trainer.device=webgpu "$@" > $O/$name.log 2>&1
  echo "== $name: exit $? $((SECONDS-t))s"; grep "\[verl-ts\] actor" $O/$name.log | head -2 | cut -c1-250; summary $O/$name/metrics.jsonl; grep -iE "error" $O/$name.log | grep -v '^+' | head -3 | cut -c1-300; }
stories stories_f32
stories stories_bf16 "${MP[@]}"
qwen qwen_f32
qwen qwen_bf16 "${MP[@]}"
