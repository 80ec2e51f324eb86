#!/usr/bin/env bash
# `pytest -m gpu` on the GPU host, alone, with its HTML report and per-test durations under $OUT.
# Usage (device tool, carry .whl): bash benchmarks/device/gpu_suite.sh
# Two gpu-marked tests need a 10-minute command each, so they run on their own: the FSDP2 test
# (benchmarks/device/fsdp.sh) and the maze curriculum (benchmarks/device/maze_curriculum_test.sh).
set -uo pipefail
[ -n "${VLRL_DEVICE_ENV:-}" ] || source benchmarks/device/env.sh
start=$SECONDS
timeout 540 python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" -m gpu -rA --durations=0 tests/gpu tests/checks tests/train tests/foundation/test_race_kernel.py tests/foundation/test_graph_steps.py \
  --deselect tests/gpu/test_fsdp_gpu.py --deselect tests/gpu/test_maze_curriculum.py \
  --html=$OUT/gpu_tests.html --self-contained-html --junitxml=$OUT/gpu_tests.xml 2>&1 | tee $OUT/gpu_tests.log | tail -45
echo "pytest -m gpu wall time: $((SECONDS - start)) s"
