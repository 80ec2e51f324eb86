#!/usr/bin/env bash
# FSDP2 on the GPU host: the gpu-marked FSDP test (torchrun --nproc-per-node 1, NCCL, 2b model: the FSDP2 steps
# vs the plain trainer's within the bf16 bound) and the throughput / peak-memory benchmark for NPROC ranks
# (default 1, with the plain trainer beside it). Results under $OUT.
# Usage (device tool, carry .whl: it holds the peft/accelerate wheels too):
#   bash benchmarks/device/fsdp.sh                                   # one H100: test + N=1 benchmark
#   NPROC=2 SKIP_TEST=1 bash benchmarks/device/fsdp.sh               # two GPUs (nvidia-h200-x2)
#   ROWS=64 MICRO=4 STEPS=3 WARMUP=1 TAG=_rows64 SKIP_TEST=1 bash benchmarks/device/fsdp.sh   # the maze recipe's step
#   ROUNDS=3 ...                    # FSDP and plain launched 3 times each, alternating (the ratio within one command)
set -uo pipefail
source benchmarks/device/env.sh
export NCCL_NVLS_ENABLE=0  # NVLink multicast off on multi-GPU hosts (KINDS.md)
NPROC=${NPROC:-1}
start=$SECONDS
if [ -z "${SKIP_TEST:-}" ]; then
  timeout 900 python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" -m gpu -rA -s --durations=0 \
    tests/gpu/test_fsdp_gpu.py --junitxml=$OUT/fsdp_gpu_test.xml 2>&1 | tee $OUT/fsdp_gpu_test.log | tail -25
  echo "fsdp gpu test wall time: $((SECONDS - start)) s"
fi
plain=$([ "$NPROC" = 1 ] && echo --plain)
timeout ${LIMIT:-900} python3 benchmarks/fsdp_throughput.py --nproc $NPROC --size 2b --device cuda --dtype bfloat16 \
  --rows ${ROWS:-8} --turns ${TURNS:-8} --micro-batch ${MICRO:-4} --warmup ${WARMUP:-2} --steps ${STEPS:-5} $plain --rounds ${ROUNDS:-1} ${PROFILE:+--profile} --out $OUT/fsdp_throughput_n$NPROC${TAG:-}.json \
  > $OUT/fsdp_throughput_n$NPROC${TAG:-}.log 2>&1
tail -3 $OUT/fsdp_throughput_n$NPROC${TAG:-}.log
python3 - "$OUT/fsdp_throughput_n$NPROC${TAG:-}.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for mode in ("fsdp", "plain"):
    if mode in r:
        m = r[mode]
        print(f"{mode}: world {m['world']}, {m['tokens_per_step']} tokens/step, step {m['step_s_median']:.3f} s "
              f"(logprobs {m['logprobs_s_median']:.3f}, update {m['update_s_median']:.3f}, "
              f"sync gather {m['sync_gather_s_median']:.3f}), {m['tokens_per_s']:.0f} tok/s, "
              f"peak GiB per rank {m['peak_mem_gib_per_rank']}, allocator {[k.get('allocator') for k in m['ranks']]}")
for i, rnd in enumerate(r.get("rounds", [])):
    print(f"round {i} {rnd['order']}: fsdp {rnd['fsdp_step_s']} plain {rnd['plain_step_s']} ratio {rnd['fsdp_over_plain_step_time']:.3f}")
print("fsdp / plain step time:", r.get("fsdp_over_plain_step_time"))
PY
echo "fsdp.sh wall time: $((SECONDS - start)) s"
