#!/usr/bin/env bash
# The maze curriculum (benchmarks/maze_curriculum.py) on the GPU host; small result files tarred under $OUT.
# Usage (device tool, carry [".whl"]): [LIMIT=s] bash benchmarks/device/maze_curriculum.sh TAG [--plan ...]
#   A later command on the same warm machine starts from the last level's weights with --weights /tmp/mc/LEVEL/weights.
#   BACK=1: the last level's model directory leaves the machine, packed by benchmarks/device/weights_parts.py (bf16,
#   ≤ 15.75 MiB parts in /tmp/wp; tiny: 2 parts, small: 4): part.00-03 come back with this call (a 5th, if any, by
#   `cp /tmp/wp/part.0[4-9] $OUT/` in a next call). PARTS=dir: start the first level from such parts, carried into
#   dir over earlier calls (weights_parts.py's header). The directory travels whole, so its processor comes along.
set -uo pipefail
source benchmarks/device/env.sh
source benchmarks/device/run_back.sh
tag=$1; shift
args=()
if [ -n "${PARTS:-}" ]; then
  unpack_parts /tmp/start || exit 1
  args=(--weights /tmp/start)
fi
timeout "${LIMIT:-570}" python3 benchmarks/maze_curriculum.py --out /tmp/mc "${args[@]}" "$@" 2>&1 \
  | grep --line-buffered -v -e "Loading weights" -e "Writing model" | tee "$OUT/$tag.log"
run_dirs_tgz "$OUT/$tag.tgz" /tmp/mc
last=$(ls -d /tmp/mc/*/weights 2>/dev/null | tail -1)
if [ -n "$last" ] && [ -n "${BACK:-}" ]; then
  pack_back "$last" /tmp/wp
  echo "$last packed: $(ls /tmp/wp | wc -l) parts in /tmp/wp, part.00-03 under \$OUT"
fi
ls -la "$OUT"
