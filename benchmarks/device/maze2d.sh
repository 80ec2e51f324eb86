#!/usr/bin/env bash
# The maze2d recipe (SFT on the BFS expert, then GRPO) on the GPU host; run files and report under $OUT.
# Usage (device tool, carry .whl): bash benchmarks/device/maze2d.sh [overrides...]
# docs/gpu-correctness.md's GPU runs: sft.steps=30 sft.rows_per_step=16 run.steps=4 rollout.rows_per_step=8 data.eval_rows=16
#   run.eval_every=0 'data.extras={"max_turns":20}' model.dtype=float32|bfloat16 (agreement_runs.sh runs both).
set -uo pipefail
source benchmarks/device/env.sh
timeout ${LIMIT:-540} python3 -m vlrl.cli train maze2d run.out=/tmp/maze run.progress=False "$@" 2>&1 | tail -3
mkdir -p $OUT/maze
cp /tmp/maze/summary.json /tmp/maze/metrics.jsonl /tmp/maze/agreement.jsonl /tmp/maze/weight_sync.jsonl /tmp/maze/config.toml $OUT/maze/ 2>/dev/null
cp /tmp/maze/image_sensitivity.jsonl $OUT/maze/ 2>/dev/null
python3 -m vlrl.cli report /tmp/maze --out $OUT/maze/report.html 2>&1 | tail -1
grep -h '"eval"' /tmp/maze/metrics.jsonl | cut -c1-160
