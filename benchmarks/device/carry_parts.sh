#!/usr/bin/env bash
# Regroup parts that came in one size into parts that fit one device call beside this repo's working tree (the limit
# is 64 MiB a call, tree and carries together; the tree was 25.7 MB at 933d637, which gzipped benchmarks/results'
# reports). SRC holds p1, p2, ... each with part.* files, read in that order as one stream. By default a part is
# what is left of 64 MiB after the tracked files, .whl and 2 MiB of margin (SIZE=20M to choose). Two uses:
# - the CUDA vLLM bundle of ../shared/tools/gpu-vllm/bundle.sh (DIR/p1..p4, 48 MiB parts; this was vllm_parts.sh);
# - a model directory packed on the device by benchmarks/device/weights_parts.py and brought back in parts of
#   ≤ 15.75 MiB (put them under SRC/p1/).
# Usage (here): bash benchmarks/device/carry_parts.sh [.gpuwork/vllm] [.gpuwork/v20]
# Then one `run` per part, back to back on one warm machine (the vLLM bundle; weights alike into /tmp/wparts):
#   carry [".whl", ".gpuwork/v20/p1"]: mkdir -p /tmp/vw && cp .gpuwork/v20/p1/part.* /tmp/vw/ && <a first command>
#   carry [".gpuwork/v20/pK"]:         cp .gpuwork/v20/pK/part.* /tmp/vw/                 (K = 2 .. N-1)
#   carry [".whl", ".gpuwork/v20/pN"]: cp .gpuwork/v20/pN/part.* /tmp/vw/ && cat /tmp/vw/part.* | tar -C /tmp/vw -xf -
#                                      && source /tmp/vw/assemble.sh && source benchmarks/device/env.sh && <command>
set -euo pipefail
src=${1:-.gpuwork/vllm}
dst=${2:-.gpuwork/v20}
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
whl=$(du -cb .whl 2>/dev/null | tail -1 | cut -f1)
size=${SIZE:-$(( (64 * 1048576 - tree - ${whl:-0} - 2 * 1048576) / 1048576 ))M}
parts=$(mktemp -d)
for d in $(ls -d "$src"/p* | sort -V); do cat "$d"/part.*; done | split -b "$size" -d -a 2 - "$parts/part."  # read all before $dst (maybe $src) is replaced
rm -rf "$dst"
mkdir -p "$dst"
mv "$parts"/part.* "$dst/" && rmdir "$parts"
n=0
for f in "$dst"/part.*; do
  n=$((n + 1))
  mkdir -p "$dst/p$n"
  mv "$f" "$dst/p$n/"
done
du -sh "$dst"/p* | sed 's/^/  /'
echo "$n parts of $size under $dst; tracked files: $tree bytes, .whl ${whl:-0}"
