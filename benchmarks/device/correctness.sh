#!/usr/bin/env bash
# GPU correctness measurements, one device command (≈ 9 min on an H100), results under $OUT:
#   kernel.json / invariance.json / old_engine.json  (benchmarks/gpu_correctness.py)
#   runs.tar.gz: maze2d runs — before (transformers' sdpa, fp32, agreement logged), after (vlrl_sdpa,
#   fp32 and bf16, run.agreement=stop) — with agreement.jsonl (per depth / turn / first-vs-rest).
# Usage (device tool, carry .whl and .old5bd): bash benchmarks/device/correctness.sh
set -uo pipefail
source benchmarks/device/env.sh
mkdir -p /tmp/runs
MAZE="sft.steps=40 sft.rows_per_step=16 run.steps=4 rollout.rows_per_step=8 data.eval_rows=16 run.eval_every=0"
maze() {  # name, overrides...
  local name=$1; shift
  OMP_NUM_THREADS=3 timeout ${LIMIT:-500} python3 -m vlrl.cli train maze2d run.out=/tmp/runs/$name run.progress=False \
    $MAZE 'data.extras={"max_turns":20}' "$@" > /tmp/runs/$name.log 2>&1
  echo "$name rc=$? $(tail -c 300 /tmp/runs/$name.log | tr '\n' ' ')"
}
python3 -c "from vlrl.models.build import cached_model_dir as c; [c('qwen2_5_vl', s) for s in ('tiny', 'tiny_kv2')]" 2>&1 | tail -1
maze before_sdpa_fp32 model.attention=sdpa model.dtype=float32 run.agreement=log &
maze after_fp32 model.dtype=float32 run.agreement=stop &
maze after_bf16 model.dtype=bfloat16 run.agreement=log &
OMP_NUM_THREADS=3 python3 benchmarks/gpu_correctness.py kernel --out $OUT/kernel.json 2>&1 | tail -2
OMP_NUM_THREADS=3 python3 benchmarks/gpu_correctness.py invariance --out $OUT/invariance.json 2>&1 | grep '^{'
OMP_NUM_THREADS=3 python3 benchmarks/gpu_correctness.py old --old-tree .old5bd --out $OUT/old_engine.json 2>&1 | grep '^{'
# The GPU suite (a trial run beside the maze runs; its clean timing is benchmarks/device/gpu_suite.sh).
OMP_NUM_THREADS=4 timeout $((560 - SECONDS)) python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" \
  -m gpu tests/gpu tests/checks -q -rA --durations=0 --html=$OUT/gpu_tests.html --self-contained-html 2>&1 | tail -40
wait
for r in /tmp/runs/*/; do grep -h '"eval"' $r/metrics.jsonl | cut -c1-160; done
tar -czf $OUT/runs.tar.gz -C /tmp runs --exclude='*/checkpoints' --exclude='*/tb'
ls -la $OUT
