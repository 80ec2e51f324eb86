#!/usr/bin/env bash
# `pytest -m gpu tests/gpu/test_maze_curriculum.py` on the GPU host, alone (--runxfail: a level marked xfail runs as
# a plain test): its HTML report, log and each level's run files (weights left out) under $OUT.
# Usage (device tool, carry .whl): LIMIT=440 bash benchmarks/device/maze_curriculum_test.sh
set -uo pipefail
source benchmarks/device/env.sh
timeout "${LIMIT:-540}" python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" -m gpu -rA --runxfail \
  --basetemp=/tmp/pt tests/gpu/test_maze_curriculum.py --html=$OUT/maze_test.html --self-contained-html 2>&1 \
  | tee $OUT/maze_test.log | tail -25
(cd /tmp/pt && tar czf "$OUT/runs.tgz" --exclude weights --exclude tb --exclude checkpoints .)
