#!/usr/bin/env bash
# Device-tool run of the maze2d recipe (SFT on the BFS expert, then GRPO) on the GPU host.
# Usage (device tool, carry build/wheels): bash scripts/device/maze2d_gpu.sh [overrides...]
set -uo pipefail
pip install -q --no-deps --target /tmp/pylib build/wheels/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONPATH=$PWD:/tmp/pylib VLRL_CACHE=/tmp/vlrl-cache HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout ${LIMIT:-520} python3 -m vlrl.cli train maze2d run.out=/tmp/maze run.progress=False "$@" 2>&1 \
  | grep -v "Loading weights" | tail -5
mkdir -p $OUT/maze
cp /tmp/maze/summary.json /tmp/maze/metrics.jsonl /tmp/maze/agreement.jsonl /tmp/maze/config.toml $OUT/maze/ 2>/dev/null
python3 -m vlrl.cli report /tmp/maze --out $OUT/maze/report.html 2>&1 | tail -1
grep '"eval"' /tmp/maze/metrics.jsonl
grep '"sft"' /tmp/maze/metrics.jsonl | tail -2
grep '"rl"' /tmp/maze/metrics.jsonl | cut -c1-220
