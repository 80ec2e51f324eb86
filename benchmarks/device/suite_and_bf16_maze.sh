#!/usr/bin/env bash
# One device command: `pytest -m gpu` (benchmarks/device/gpu_suite.sh) in front, and beside it the maze2d
# GPU recipe in bf16 with run.agreement=stop (SFT, then 4 GRPO steps). Results under $OUT.
set -uo pipefail
source benchmarks/device/env.sh; export VLRL_DEVICE_ENV=1
mkdir -p /tmp/runs
( OMP_NUM_THREADS=4 timeout 575 python3 -m vlrl.cli train maze2d run.out=/tmp/runs/maze2d_bf16 \
    run.progress=False sft.steps=30 sft.rows_per_step=8 run.steps=4 rollout.rows_per_step=8 data.eval_rows=8 \
    run.eval_every=0 'data.extras={"max_turns":20}' model.dtype=bfloat16 > /tmp/runs/maze2d_bf16.log 2>&1;
  echo "maze2d_bf16 rc=$? $(tail -c 300 /tmp/runs/maze2d_bf16.log | tr '\n' ' ')" ) &
OMP_NUM_THREADS=6 bash benchmarks/device/gpu_suite.sh
wait
python3 -m vlrl.cli report /tmp/runs/maze2d_bf16 --out $OUT/maze2d_bf16_report.html 2>&1 | tail -1
tar -czf $OUT/maze2d_bf16.tar.gz --exclude='checkpoints' --exclude='tb' --exclude='samples' -C /tmp runs
ls -la $OUT
