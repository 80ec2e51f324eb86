#!/usr/bin/env bash
# The maze curriculum (benchmarks/maze_curriculum.py) on the GPU host; small result files tarred under $OUT.
# Usage (device tool, carry [".whl"]): [LIMIT=s] bash benchmarks/device/maze_curriculum.sh TAG [--plan ...]
#   WEIGHTS=prefix: start the first level from a tiny checkpoint's model.safetensors split into prefix.part*
#   (what an earlier command returned); the last level's weights come back split the same way when they fit
#   (tiny: 40 MB; small's 174 MB do not: a later command on the same warm machine passes --weights /tmp/mc/LEVEL/weights).
#   BACK=1: larger weights leave the machine too, packed by benchmarks/device/weights_parts.py (bf16, 15 MiB parts in
#   /tmp/wp): the first 4 parts come back with this call, `cp /tmp/wp/part.0[4-9] $OUT/` in a next call the rest.
#   PARTS=dir: start the first level from such parts, carried into dir over earlier calls (weights_parts.py's header).
set -uo pipefail
source benchmarks/device/env.sh
tag=$1; shift
args=()
if [ -n "${WEIGHTS:-}" ]; then
  base=$(python3 -c "from vlrl.models.build import cached_model_dir; print(cached_model_dir('qwen2_5_vl', 'tiny'))")
  rm -rf /tmp/start && cp -r "$base" /tmp/start && cat "$WEIGHTS".part* > /tmp/start/model.safetensors
  args=(--weights /tmp/start)
elif [ -n "${PARTS:-}" ]; then
  rm -rf /tmp/start && python3 benchmarks/device/weights_parts.py unpack "$PARTS" /tmp/start || exit 1
  args=(--weights /tmp/start)
fi
timeout "${LIMIT:-570}" python3 benchmarks/maze_curriculum.py --out /tmp/mc "${args[@]}" "$@" 2>&1 \
  | grep --line-buffered -v -e "Loading weights" -e "Writing model" | tee "$OUT/$tag.log"
(cd /tmp/mc && tar czf "$OUT/$tag.tgz" --exclude weights --exclude tb --exclude checkpoints .)
last=$(ls -d /tmp/mc/*/weights 2>/dev/null | tail -1)
if [ -n "$last" ] && [ "$(stat -c %s "$last/model.safetensors")" -le $((45 * 2**20)) ]; then
  split -b 15M "$last/model.safetensors" "$OUT/${tag}_weights.part"
elif [ -n "$last" ] && [ -n "${BACK:-}" ]; then
  rm -rf /tmp/wp && python3 benchmarks/device/weights_parts.py pack "$last" /tmp/wp && cp /tmp/wp/part.0[0-3] "$OUT/"
  echo "$last packed: $(ls /tmp/wp | wc -l) parts in /tmp/wp, part.00-03 under \$OUT"
fi
ls -la "$OUT"
