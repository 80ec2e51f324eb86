#!/usr/bin/env bash
# Device-tool experiment: several color_square recipe variants in parallel on the GPU host's 16 CPU
# cores (2 threads each), to pick the CPU recipe's settings. Results (metrics, summaries) under $OUT.
set -uo pipefail
source benchmarks/device/env.sh
export OMP_NUM_THREADS=2
python3 -c "from vlrl.models.build import cached_model_dir; print(cached_model_dir('qwen2_5_vl','tiny'))" 2>&1 | tail -1
run() {  # name, overrides...
  local name=$1; shift
  timeout ${LIMIT:-500} python3 -m vlrl.cli train color_square run.out=$OUT/$name run.progress=False run.samples=2 "$@" \
    > $OUT/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $OUT/$name.log | cut -c1-300)"
}
while read -r line; do [ -n "$line" ] && run $line & done < "${SWEEP:-benchmarks/device/color_square_sweep.txt}"
wait
for f in $OUT/*/metrics.jsonl; do echo "== $f"; grep '"eval"' $f | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['step'], r['label'], r['eval_reward_mean'], r['time'])"; done
