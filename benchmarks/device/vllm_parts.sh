#!/usr/bin/env bash
# Re-split the CUDA vLLM bundle of ../shared/tools/gpu-vllm/bundle.sh (DIR/p1..p4, 48 MiB parts) into parts that fit
# one device call beside this repo's working tree (37 MiB of tracked files at 2026-11-28, the limit 64 MiB a call).
# Usage (here): bash benchmarks/device/vllm_parts.sh [.gpuwork/vllm] [.gpuwork/v20]   (SIZE=20M by default)
# Then one `run` per part, back to back on one warm machine:
#   carry [".whl", ".gpuwork/v20/p1"]: mkdir -p /tmp/vw && cp .gpuwork/v20/p1/part.* /tmp/vw/ && <a first command>
#   carry [".gpuwork/v20/pK"]:         cp .gpuwork/v20/pK/part.* /tmp/vw/                 (K = 2 .. N-1)
#   carry [".whl", ".gpuwork/v20/pN"]: cp .gpuwork/v20/pN/part.* /tmp/vw/ && cat /tmp/vw/part.* | tar -C /tmp/vw -xf -
#                                      && source /tmp/vw/assemble.sh && source benchmarks/device/env.sh && <command>
set -euo pipefail
src=${1:-.gpuwork/vllm}
dst=${2:-.gpuwork/v20}
rm -rf "$dst"
mkdir -p "$dst"
cat "$src"/p*/part.* | split -b "${SIZE:-20M}" -d -a 2 - "$dst/part."
n=0
for f in "$dst"/part.*; do
  n=$((n + 1))
  mkdir -p "$dst/p$n"
  mv "$f" "$dst/p$n/"
done
du -sh "$dst"/p* | sed 's/^/  /'
echo "$n parts under $dst; tracked files: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
