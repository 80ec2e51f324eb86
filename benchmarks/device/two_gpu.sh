#!/usr/bin/env bash
# The two-GPU FSDP2 measurement on nvidia-h200-x2, in two commands of < 10 minutes (results under $OUT):
#   PART=bench bash benchmarks/device/two_gpu.sh   # 2b: 2 ranks vs 1 rank in one call (speed-up, the first
#                                                   # steps' losses on the same data, peak memory per GPU); the
#                                                   # same-data losses again in fp32; then the tiny run's NCCL
#                                                   # proofs (2 ranks = 1, 2 -> 1 resume)
#   PART=test bash benchmarks/device/two_gpu.sh    # the 2b gpu-marked FSDP test with 2 ranks
# Usage (device tool, kind nvidia-h200-x2, carry .clean = git archive HEAD + .whl): cd .clean && PART=... bash ...
set -uo pipefail
source benchmarks/device/env.sh
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (KINDS.md)
PART=${PART:-bench}
start=$SECONDS
if [ "$PART" = bench ]; then
  timeout ${BENCH_LIMIT:-320} python3 benchmarks/fsdp_throughput.py --nproc 2 --size 2b --device cuda --dtype bfloat16 \
    --rows ${ROWS:-8} --turns ${TURNS:-8} --steps ${STEPS:-5} --compare-one-rank --out $OUT/fsdp_throughput_n2.json \
    > $OUT/fsdp_throughput_n2.log 2>&1
  python3 - "$OUT/fsdp_throughput_n2.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for key in ("fsdp", "one_rank", "one_rank_same_data"):
    m = r[key]
    print(f"{key}: world {m['world']}, {m['tokens_per_step']} tokens/step, step {m['step_s_median']:.3f} s, "
          f"{m['tokens_per_s']:.0f} tok/s, peak GiB per rank {m['peak_mem_gib_per_rank']}")
print("speed-up vs one rank:", r["speedup_vs_one_rank"], "(bar 1.8)")
print("first 3 losses, 2 ranks vs 1 rank on the same data:", r["losses_n_ranks"][:3], r["losses_one_rank_same_data"][:3],
      "max |diff|", r["loss_max_abs_diff_first3"], "(bar 1e-3)")
PY
  # fp32 (TF32 off): the same-data losses without bf16's rounding of the masters (is 2 ranks = 1 rank exact?)
  timeout ${FP32_LIMIT:-140} python3 benchmarks/fsdp_throughput.py --nproc 2 --size 2b --device cuda --dtype float32 \
    --rows 4 --turns ${TURNS:-8} --steps 1 --warmup 2 --compare-one-rank same-data --out $OUT/fsdp_losses_fp32_n2.json \
    > $OUT/fsdp_losses_fp32_n2.log 2>&1
  python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print('fp32 losses, 2 ranks vs 1 rank:', \
r['losses_n_ranks'], r['losses_one_rank_same_data'], 'max |diff|', r['loss_max_abs_diff_first3'])" \
    $OUT/fsdp_losses_fp32_n2.json
  timeout ${TEST_LIMIT:-100} python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" -m gpu -rA \
    tests/gpu/test_fsdp_two_gpus.py --junitxml=$OUT/two_gpu_tests.xml 2>&1 | tee $OUT/two_gpu_tests.log | tail -8
else
  VLRL_FSDP_NPROC=2 timeout 560 python3 -m pytest -p pytest_vlrl.plugin -o addopts="-p no:cacheprovider" -m gpu -rA -s \
    tests/gpu/test_fsdp_gpu.py --junitxml=$OUT/fsdp_gpu_test_n2.xml 2>&1 | tee $OUT/fsdp_gpu_test_n2.log | tail -12
fi
echo "two_gpu.sh ($PART) wall time: $((SECONDS - start)) s"
