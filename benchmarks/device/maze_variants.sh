#!/usr/bin/env bash
# Several maze-curriculum variants at once on the GPU host (benchmarks/maze_curriculum.py, one process each:
# the tiny models leave the GPU mostly idle and each process renders on its own cores). Small result files
# of every variant tarred under $OUT. Usage (device tool, from .clean, carry .clean):
#   PLAN=5x5:250:150:48 bash benchmarks/device/maze_variants.sh
set -uo pipefail
source benchmarks/device/env.sh
python3 -c "from vlrl.models.build import cached_model_dir as c; from vlrl.envs.maze_curriculum import \
small_checkpoint as s; print(c('qwen2_5_vl', 'tiny'), s())" || exit 1
plan=${PLAN:-5x5:250:150:48}
noise0='data.extras={"expert_noise":0.0}'
declare -A V=(
  [tiny_vis10]="--model tiny --set sft.lr=3e-3 --set optim.lr=1e-3 --sft-scale vision=10 --sft-scale merger=10"
  [small]="--model small --set sft.lr=1e-3 --set optim.lr=3e-4"
  [small_vis10]="--model small --set sft.lr=1e-3 --set optim.lr=3e-4 --sft-scale vision=10 --sft-scale merger=10"
  [small_noise0]="--model small --set sft.lr=1e-3 --set optim.lr=3e-4 --set $noise0"
)
for name in "${!V[@]}"; do
  OMP_NUM_THREADS=3 timeout "${LIMIT:-470}" python3 benchmarks/maze_curriculum.py --out /tmp/mv/$name --plan $plan \
    ${V[$name]} > /tmp/mv_$name.log 2>&1 &
done
wait
for name in "${!V[@]}"; do echo "== $name"; grep -v -e "Loading weights" -e "Writing model" /tmp/mv_$name.log | tail -4; done
(cd /tmp/mv && tar czf "$OUT/variants.tgz" --exclude weights --exclude tb --exclude checkpoints . /tmp/mv_*.log)
ls -la "$OUT"
