# Issue 21 GPU measurement in one device call (run from a clean copy; env.sh sourced first):
#   vlrl bench on the 2b model (bf16), the packing throughput benchmark (16 rows), and a profile of one packed
#   train step (top kernels by CUDA time, and how many attention calls the step makes) to find the MFU lever.
# Each part has its own time limit; results land in $OUT.
set -u
timeout ${BENCH_S:-300} python3 -m vlrl.cli bench --size 2b --device cuda --dtype bfloat16 \
  --out $OUT/bench_h100_2b.json 2>&1 | grep -v "Loading weights" | tail -30
timeout ${PACK_S:-100} python3 benchmarks/packing_throughput.py --device cuda --size 2b --dtype bfloat16 --rows 16 \
  --out $OUT/packing_h100_2b.json > $OUT/packing.log 2>&1; tail -c 600 $OUT/packing.log
timeout ${PROF_S:-60} python3 - <<'PY' > $OUT/profile.txt 2>&1; head -c 5000 $OUT/profile.txt
import sys, torch
sys.path.insert(0, "benchmarks")
import packing_throughput as pt
from torch.profiler import ProfilerActivity, profile
from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.train.batch import CollateSpec, collate
model_dir = cached_model_dir("qwen2_5_vl", "2b")
model = load_model(model_dir, dtype=torch.bfloat16, device="cuda").train()
batch = collate(pt.trajectories(model_dir, 8, [1, 2, 4, 8]), CollateSpec.from_model(model)).to("cuda")
subs, n = batch.split(4), int(batch.loss_mask.sum())
pt.train_step(model, subs, n, True)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    pt.train_step(model, subs, n, True)
    torch.cuda.synchronize()
print("tokens", int(batch.seq_lens.sum()), "images", int(batch.image_counts.sum()))
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))
PY
