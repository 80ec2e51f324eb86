#!/usr/bin/env bash
# The maze curriculum (benchmarks/maze_curriculum.py) on the GPU host; small result files tarred under $OUT.
# Usage (device tool, from .clean, carry .clean): bash benchmarks/device/maze_curriculum.sh TAG [--plan ...]
#   WEIGHTS=prefix: start the first level from a tiny checkpoint's model.safetensors split into prefix.part*
#   (what an earlier command returned); the last level's weights come back split the same way when they fit
#   (tiny: 40 MB; small's 174 MB do not: a later command on the same warm machine passes --weights /tmp/mc/LEVEL/weights).
set -uo pipefail
source benchmarks/device/env.sh
tag=$1; shift
args=()
if [ -n "${WEIGHTS:-}" ]; then
  base=$(python3 -c "from vlrl.models.build import cached_model_dir; print(cached_model_dir('qwen2_5_vl', 'tiny'))")
  rm -rf /tmp/start && cp -r "$base" /tmp/start && cat "$WEIGHTS".part* > /tmp/start/model.safetensors
  args=(--weights /tmp/start)
fi
timeout "${LIMIT:-570}" python3 benchmarks/maze_curriculum.py --out /tmp/mc "${args[@]}" "$@" 2>&1 \
  | grep --line-buffered -v -e "Loading weights" -e "Writing model" | tee "$OUT/$tag.log"
(cd /tmp/mc && tar czf "$OUT/$tag.tgz" --exclude weights --exclude tb --exclude checkpoints .)
last=$(ls -d /tmp/mc/*/weights 2>/dev/null | tail -1)
if [ -n "$last" ] && [ "$(stat -c %s "$last/model.safetensors")" -le $((45 * 2**20)) ]; then
  split -b 15M "$last/model.safetensors" "$OUT/${tag}_weights.part"
fi
ls -la "$OUT"
