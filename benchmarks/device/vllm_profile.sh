#!/usr/bin/env bash
# Where the CPU time of vlrl's vLLM path goes: py-spy (a wheel carried in .tools/) samples every process of one
# `benchmarks/vllm_path_breakdown.py` run — the bench (vlrl's client, the embedded renderer's threads), vLLM's API
# server and its engine core — busy samples only, per thread (`--threads`), collapsed stacks to $OUT/pyspy_raw.txt.gz, summarised by benchmarks/pyspy_summary.py.
# Usage (device tool, the vLLM bundle unpacked in /tmp/vw; carry your clean copy with .tools/py_spy-*.whl):
#   cd CLEAN && RATE=25 bash benchmarks/device/vllm_profile.sh 256 --paired --repeats 3
# SCRIPT=benchmarks/inprocess_breakdown.py profiles the in-process engine instead (its own arguments then, e.g.
#   `SCRIPT=benchmarks/inprocess_breakdown.py bash benchmarks/device/vllm_profile.sh --sizes 256 --variants path`).
set -uo pipefail
[ -n "${VLRL_DEVICE_ENV:-}" ] || source benchmarks/device/env.sh
source /tmp/vw/assemble.sh || { echo "no vLLM bundle in /tmp/vw (carry its parts first)"; exit 3; }
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .tools/py_spy-*.whl || exit 4
timeout -s INT ${LIMIT:-480} /tmp/pyspy/bin/py-spy record --subprocesses --threads --format raw -r ${RATE:-25} \
  -o $OUT/pyspy_raw.txt -- python3 ${SCRIPT:-benchmarks/vllm_path_breakdown.py} $OUT/breakdown_profiled.json "$@" 2>&1 \
  | grep -v Warning | tail -20
# the raw stacks run to tens of MiB: a JSON summary and the gzipped stacks come back
python3 benchmarks/pyspy_summary.py $OUT/pyspy_raw.txt $OUT/pyspy_summary.json --top 40
gzip -9 $OUT/pyspy_raw.txt; ls -la $OUT
