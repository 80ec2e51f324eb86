"""Where a maze-curriculum SFT step's time goes, one process alone on the device (no GPU sharing).

    python benchmarks/maze_step_profile.py --out prof.json [--rows 64] [--level 5x5] [--tf32]
        [--set section.key=value ...]

For each tile size (28 px, the recipe's; 25 px, VisGym's) and micro-batch size: the time to generate one
batch of expert episodes (the SFT pool's cost), the median of a few SFT updates on it (the small model,
random init), and one greedy rollout of as many eval mazes (the eval's cost). Then ``torch.profiler`` over
one update: the ops with the most device time and how many kernels the update launched. Writes the JSON.
``--tf32``: the fp32 model's matmuls and convolutions in TF32 (``Run`` turns TF32 off for an fp32 run on CUDA, so
that rollout and trainer agree; the SFT steps have no such check), to see what the SFT phase would gain.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_models import start_checkpoint


def _timed(fn) -> float:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t


def measure(
    level: str, tile: int, micro: int, rows: int, sets: list[str], repeats: int, tf32: bool, greedy: bool
) -> dict:
    """Timings of one (tile, micro-batch) setting; the profiler's table for the first setting only."""
    from vlrl.envs.maze_sft_data import expert_episodes
    from vlrl.train.loop import require_batch
    from vlrl.train.run import Run
    from vlrl.train.trainer import Trainer

    extras = f'data.extras={{"expert_noise":0.15,"tile":{tile}}}'
    plan = LevelPlan(level, 0, 0, overrides=(extras, f"optim.micro_batch_size={micro}", *sets))
    run = Run(level_config(plan, f"/tmp/maze_step_profile/{level}_{tile}_{micro}", start_checkpoint()))
    if tf32:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        trajs: list = []
        gen = _timed(lambda: trajs.extend(expert_episodes(run, run.next_rows(rows), 0, masked=True)))
        batch = require_batch(run, trajs, "profile")
        trainer = Trainer(run.model, run.cfg.algo, dataclasses.replace(run.cfg.optim, lr=1e-4))
        run.sft_update(trainer, batch)  # warm-up: allocator, kernels' first use
        steps = [_timed(lambda: run.sft_update(trainer, batch)) for _ in range(repeats)]
        greedy_s = None
        if greedy:
            greedy_s = _timed(
                lambda: run.rollout(run.eval_rows[:rows], seed=1, temperature=0.0, repeats=1, shared=False)
            )
        row = {
            "level": level,
            "tf32": tf32,
            "dtype": run.cfg.model.dtype,
            "tile": tile,
            "micro_batch": micro,
            "episodes": rows,
            "images": int(batch.image_grid_thw.shape[0]),
            "tokens": int(batch.attention_mask.sum()),
            "pixel_mb": round(batch.pixel_values.nelement() * batch.pixel_values.element_size() / 1e6, 1),
            "expert_batch_s": round(gen, 3),
            "sft_update_s": round(statistics.median(steps), 4),
            "greedy_rollout_s": None if greedy_s is None else round(greedy_s, 3),
        }
        return row | _profile(run, trainer, batch)
    finally:
        run.close()


def _profile(run, trainer, batch) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run.sft_update(trainer, batch)
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:12]
    return {
        "cuda_kernels": kernels,
        "top_ops": [
            {"op": e.key[:80], "count": e.count, "device_ms": round(e.self_device_time_total / 1e3, 2)} for e in top
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=64, help="episodes per SFT batch (and greedy rollout)")
    ap.add_argument("--micro", type=int, action="append", default=[], help="micro-batch sizes (default 64, 16)")
    ap.add_argument("--tile", type=int, action="append", default=[], help="tile sizes (default 28, 25)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--level", default="5x5", help="maze2d level: 5x5, 7x7, easy or hard")
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions for the fp32 model")
    ap.add_argument("--no-greedy", action="store_true", help="skip the greedy rollout")
    ap.add_argument("--set", action="append", default=[], help="section.key=value")
    args = ap.parse_args(argv)
    rows = []
    for tile in args.tile or [28, 25]:
        for micro in args.micro or [64, 16]:
            rows.append(
                measure(args.level, tile, micro, args.rows, args.set, args.repeats, args.tf32, not args.no_greedy)
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "top_ops"}), flush=True)
            Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
