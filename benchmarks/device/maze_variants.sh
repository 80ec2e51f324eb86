#!/usr/bin/env bash
# Several maze-curriculum variants at once on the GPU host (benchmarks/maze_curriculum.py, one process each:
# the tiny models leave the GPU mostly idle and each process renders on its own cores). Small result files
# of every variant tarred under $OUT. Usage (device tool, carry [".whl"]):
#   [SET=takeover|easy7|stats|open|align|reuse|grpo5|lr7|grpo7|grpo|fan_in|tile|next|first] [PLAN=level:sft_s:rl_s:pool]
#   [PARTS=dir] [BACK=variant] LIMIT=565 bash benchmarks/device/maze_variants.sh
# SET=first with PLAN=5x5:230:150:48 LIMIT=440 made benchmarks/results/maze_curriculum_h100/variants_5x5
# (sft.rows_per_step=32, micro_batch_size=16 then); SET=tile (the default) with PLAN=5x5:390:120:12 LIMIT=565
# made benchmarks/results/maze_curriculum_h100/tile_5x5 (at b420c5d, where the recipe drew 28 px tiles).
# The sets ran with `--sft-warmup 10` (seconds, gone since lease_v2: docs/maze.md item 27); a ramp of 30 steps here.
set -uo pipefail
source benchmarks/device/env.sh
python3 -c "from vlrl.models.build import cached_model_dir as c; from vlrl.envs.maze_models import \
start_checkpoint as s; print(c('qwen2_5_vl', 'tiny'), s(), s('qwen2_5_vl', 'tiny', 'fan_in'), \
s('qwen2_5_vl', 'small', 'fan_in'), s('qwen3_vl', 'tiny', 'fan_in'))" || exit 1
plan=${PLAN:-5x5:390:120:12}
noise0='data.extras={"expert_noise":0.0}'
small="--model small --set sft.lr=1e-3"
declare -A V
start=""  # PARTS=dir: the variants start from weights carried in as parts (weights_parts.py), unpacked once
if [ -n "${PARTS:-}" ]; then
  rm -rf /tmp/start && python3 benchmarks/device/weights_parts.py unpack "$PARTS" /tmp/start || exit 1
  start="--weights /tmp/start"
fi
if [ "${SET:-tile}" = easy7 ]; then  # from PARTS (chain_v10's easy6): more SFT with the branch detours beside GRPO
  # at two RL lrs, one loss per episode (seq_mean_token_mean), under VisGym's 20 turns (train and eval rows).
  # As run in chain_v11 the GRPO pair died of CUDA out-of-memory beside the SFT (81-105 GiB at micro-batches of
  # 64); that SFT alone is what this set measured. The GRPO pair ran alone in the next call (chain_v11 COMMANDS.md).
  sft="$start --init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --set data.eval_rows=200 --mask-detours \
--sft-fill processes --sft-builders 8 --set run.seed=8 --set data.train_rows=16384 \
--set data.extras.expert_branch=0.15 --plan easy:${SFT_S:-430}:0:8:0"
  rl="$start --init fan_in --set data.eval_rows=200 --set data.train_rows=16384 --set data.extras.max_turns=20 \
--set algo.loss_agg=seq_mean_token_mean --set optim.warmup_steps=3 --plan easy:0:${RL_S:-430}:8:0"
  V=([easy7]="$sft" [g1e-5]="$rl --set optim.lr=1e-5 --set run.seed=9" [g3e-5]="$rl --set optim.lr=3e-5 --set run.seed=10")
elif [ "${SET}" = takeover ]; then  # from PARTS: item 19's SFT with takeover episodes every 4th step (the policy
  # plays up to 12 turns, then the expert) against the same without them, side by side: micro-batches of 16 so that
  # both fit the GPU, 7 builders each. Run by hand in chain_v12 (docs/maze.md item 21) with 200 eval mazes each:
  # two such evals at once did not fit the clock: 100 here, and leave LIMIT >= SFT_S + 130 (startup ~35 s).
  common="$start --init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --set data.eval_rows=100 --mask-detours \
--sft-fill processes --sft-builders 7 --set optim.micro_batch_size=16 --set run.seed=12 --set data.train_rows=16384 \
--set data.extras.expert_branch=0.15 --plan easy:${SFT_S:-420}:0:8:0"
  V=([takeover]="$common --takeover 4:12" [plain]="$common")
elif [ "${SET}" = grpo5 ]; then  # GRPO over SFT at 5x5: SFT (tiny, fan-in) ends once 30 % of 32 training
  # mazes are solved greedily, then GRPO at two RL lrs (ramped over 5 steps), two at once
  common="--init fan_in --first-turns 40 --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours --model tiny \
--plan 5x5:280:270:12 --sft-until ${UNTIL:-0.3} --set optim.warmup_steps=5"
  V=([lr1e-4]="$common --set optim.lr=1e-4" [lr3e-5]="$common --set optim.lr=3e-5")
elif [ "${SET}" = align ]; then  # one Qwen3-VL token (32 px) per maze tile against VisGym's 25 px frames resized to
  # 224 px (easy: 7 x 7 tokens over 9 x 9 tiles); the same weights, SFT from worker processes, two at once
  common="--model small --init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --set model.arch=qwen3_vl \
--set data.train_rows=200000 --set data.eval_rows=100 --mask-detours --sft-fill processes --sft-builders 3 \
--plan 5x5:${FIVE:-110}:0:12:45 --plan easy:${EASY:-320}:0:6:20"
  V=([tile32]="$common --image-side 352 --set data.extras.tile=32" [tile25]="$common")
elif [ "${SET}" = reuse ]; then  # easy on fresh mazes against the same mazes again, SFT from worker processes
  # (maze_sft_farm): many builders keep the pool fresh (each batch trained on ~once), one builder makes the steps
  # cycle over the pool's 8 batches; both from their own 5x5 level (the same settings), two at once
  common="--model small --init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --set model.arch=qwen3_vl \
--set data.train_rows=200000 --set data.eval_rows=100 --mask-detours --sft-fill processes \
--plan 5x5:90:0:12:45 --plan easy:${EASY:-380}:0:8:20"
  V=([fresh]="$common --sft-builders 6" [reuse]="$common --sft-builders 1")
elif [ "${SET}" = stats ]; then  # (not yet run) the maze frames' own pixel statistics (--image-stats maze,
  # docs/maze.md item 16) against the architecture's CLIP constants: 5x5 -> 7x7 as chain_v7, the same weights, two at once
  common="--model small --init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours --set data.eval_rows=100 \
--plan 5x5:${FIVE:-110}:0:12:50 --plan 7x7:${SEVEN:-300}:0:12:20"
  V=([maze]="$common --image-stats maze" [model]="$common")
elif [ "${SET}" = open ]; then  # (not yet run) the expert's replies name the open directions first (extras
  # expert_open, docs/maze.md item 13) against plain replies: 5x5 -> 7x7 as chain_v3 (81 % at 7x7 alone), two at once
  common="--model small --init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours --set data.eval_rows=100 \
--plan 5x5:${FIVE:-110}:0:12:50 --plan 7x7:${SEVEN:-300}:0:12:20"
  V=([open]="$common --set data.extras.expert_open=True --set rollout.max_tokens=20" [plain]="$common")
elif [ "${SET}" = lr7 ]; then  # (not yet run) 7x7 with lower, ramped RL lrs (docs/maze.md item 9), two at once
  common="--init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours --model small --plan 5x5:150:0:12:60 \
--plan 7x7:220:170:12:20 --set optim.warmup_steps=5"
  V=([lr3e-5]="$common --set optim.lr=3e-5" [lr1e-5]="$common --set optim.lr=1e-5")
elif [ "${SET}" = grpo7 ]; then  # 5x5 -> 7x7 (first turns per level), GRPO at 7x7 by RL lr and SFT time
  common="--init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours --model small --plan 5x5:130:0:12:60"
  V=([lr1e-4]="$common --plan 7x7:160:180:12:20 --set optim.lr=1e-4"
     [lr3e-4]="$common --plan 7x7:160:180:12:20 --set optim.lr=3e-4"
     [sft100]="$common --plan 7x7:100:240:12:20 --set optim.lr=1e-4")
elif [ "${SET}" = grpo ]; then  # fan-in; a short SFT then a long GRPO at 5x5, and 5x5 -> 7x7 (own plans)
  common="--init fan_in --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours --set optim.lr=1e-4"
  V=([sft110]="$common --model tiny --first-turns 60 --plan 5x5:110:340:12"
     [sft150]="$common --model tiny --first-turns 70 --plan 5x5:150:300:12"
     [to7x7]="$common --model small --first-turns 70 --plan 5x5:170:0:12 --plan 7x7:200:40:12")
elif [ "${SET}" = fan_in ]; then  # fan-in init, SFT on first turns first (docs/maze.md)
  common="--init fan_in --first-turns ${FIRST:-120} --sft-warmup-steps 30 --set sft.lr=1e-3 --mask-detours"
  V=([tiny]="$common --model tiny --set optim.lr=1e-4"
     [small]="$common --model small --set optim.lr=1e-4"
     [tiny_q3]="$common --model tiny --set model.arch=qwen3_vl --set optim.lr=1e-4")
elif [ "${SET}" = tile ]; then  # 28 px tiles against VisGym's 25 px (the recipe's), detours masked
  common="$small --set optim.lr=1e-4 --sft-scale vision=10 --sft-scale merger=10 --mask-detours"
  V=([tile28]="$common --set data.extras={\"expert_noise\":0.15,\"tile\":28}"
     [tile25]="$common --set data.extras={\"expert_noise\":0.15,\"tile\":25}")
elif [ "${SET}" = first ]; then  # the variants of benchmarks/results/maze_curriculum_h100/variants_5x5
  V=([tiny_vis10]="--model tiny --set sft.lr=3e-3 --set optim.lr=1e-3 --sft-scale vision=10 --sft-scale merger=10"
     [small]="$small --set optim.lr=3e-4" [small_noise0]="$small --set optim.lr=3e-4 --set $noise0"
     [small_vis10]="$small --set optim.lr=3e-4 --sft-scale vision=10 --sft-scale merger=10")
else  # SET=next (never run): longer SFT, the vision lever with detours masked or none, a gentler RL lr
  vis10="--sft-scale vision=10 --sft-scale merger=10"
  V=([small_vis10]="$small --set optim.lr=1e-4 $vis10"
     [small_vis10_mask]="$small --set optim.lr=1e-4 $vis10 --mask-detours"
     [small_vis10_noise0]="$small --set optim.lr=1e-4 --set $noise0 $vis10"
     [small_vis30_mask]="$small --set optim.lr=1e-4 --sft-scale vision=30 --sft-scale merger=30 --mask-detours")
fi
threads=${THREADS:-$((16 / ${#V[@]}))}  # the host's 16 cores shared out: each process renders its own episodes
for name in "${!V[@]}"; do
  p="--plan $plan"; [[ ${V[$name]} == *--plan* ]] && p=""  # a variant may bring its own plan
  OMP_NUM_THREADS=$threads timeout "${LIMIT:-470}" python3 benchmarks/maze_curriculum.py --out /tmp/mv/$name $p \
    ${V[$name]} > /tmp/mv_$name.log 2>&1 &
done
wait
for name in "${!V[@]}"; do echo "== $name"; grep -v -e "Loading weights" -e "Writing model" /tmp/mv_$name.log | tail -4; done
(cd /tmp/mv && tar czf "$OUT/variants.tgz" --exclude weights --exclude tb --exclude checkpoints . /tmp/mv_*.log)
if [ -n "${BACK:-}" ]; then  # BACK=name: that variant's weights packed into /tmp/wp, part.00-03 under $OUT
  last=$(ls -d /tmp/mv/$BACK/*/weights | tail -1)
  rm -rf /tmp/wp && python3 benchmarks/device/weights_parts.py pack "$last" /tmp/wp && cp /tmp/wp/part.0[0-3] "$OUT/"
fi
ls -la "$OUT"
