#!/usr/bin/env bash
# The maze2d GPU recipe in fp32 and bf16 with run.agreement=stop (SFT, then 4 GRPO steps), side by side,
# and the bf16 gap diagnosis of the 2b model (benchmarks/gpu_bf16_gap.py). Results under $OUT:
# runs.tar.gz (metrics / agreement / image_sensitivity / summary / config), <run>_report.html, bf16_gap.json.
# Usage (device tool, carry .whl): bash benchmarks/device/agreement_runs.sh [extra overrides...]
set -uo pipefail
source benchmarks/device/env.sh
mkdir -p /tmp/runs
MAZE="sft.steps=30 sft.rows_per_step=16 run.steps=4 rollout.rows_per_step=8 data.eval_rows=16 run.eval_every=0"
maze() {  # name, overrides...
  local name=$1; shift
  OMP_NUM_THREADS=5 timeout ${LIMIT:-540} python3 -m vlrl.cli train maze2d run.out=/tmp/runs/$name run.progress=False \
    $MAZE 'data.extras={"max_turns":20}' run.image_probe=True "$@" > /tmp/runs/$name.log 2>&1
  echo "$name rc=$? $(tail -c 400 /tmp/runs/$name.log | tr '\n' ' ')"
}
maze maze2d_fp32 model.dtype=float32 "$@" &
maze maze2d_bf16 model.dtype=bfloat16 "$@" &
OMP_NUM_THREADS=4 python3 benchmarks/gpu_bf16_gap.py --size 2b --out $OUT/bf16_gap.json 2>&1 | grep '^{'
wait
for r in maze2d_fp32 maze2d_bf16; do
  python3 -m vlrl.cli report /tmp/runs/$r --out $OUT/${r}_report.html 2>&1 | tail -1
  grep -h '"eval"' /tmp/runs/$r/metrics.jsonl | cut -c1-150
done
tar -czf $OUT/runs.tar.gz --exclude='checkpoints' --exclude='tb' --exclude='samples' -C /tmp runs
ls -la $OUT
