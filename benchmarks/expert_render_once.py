"""How much of an expert SFT batch's build is the per-turn rendering: the rollout path re-renders the conversation
every turn (``vlrl.envs.maze_sft_data.expert_episodes``, as the farm's workers build batches); rendering each
finished conversation once gives the same ids here, so the rest is what a render-once path could save.

    python benchmarks/expert_render_once.py [--level easy] [--rows 32] [--model small]
        [--out benchmarks/results/expert_render_once_cpu.json]

One thread (as a farm worker), the expert with its detours (``expert_noise`` and ``expert_branch`` 0.15), fresh
mazes after a warm-up batch, the renderer's image cache emptied before each timing. ``ids_equal`` counts episodes
whose one render starts with the rollout's prompt + response ids (it may end with a generation prompt) and holds
the same pixel values.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", default="easy")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--model", choices=["tiny", "small"], default="small")
    ap.add_argument("--out", default="benchmarks/results/expert_render_once_cpu.json")
    args = ap.parse_args(argv)

    import torch
    from maze_perception import append_run

    from vlrl.envs.maze_curriculum import LevelPlan, level_config
    from vlrl.envs.maze_models import start_checkpoint
    from vlrl.envs.maze_sft_data import expert_episodes
    from vlrl.train.run import Run

    torch.set_num_threads(1)
    weights = start_checkpoint("qwen2_5_vl", args.model, "fan_in", image_stats="maze")
    extras = 'data.extras={"expert_noise":0.15,"expert_branch":0.15}'
    sets = ("model.device=cpu", f"model.path={weights}", f"data.train_rows={args.rows + 8}", extras)
    run = Run(level_config(LevelPlan(args.level, 60, 0, overrides=sets), Path("/tmp/vlrl-render-once")))
    expert_episodes(run, run.next_rows(8), 0, masked=True)  # warm-up
    rows = run.next_rows(args.rows)
    run.renderer.forget()
    t = time.time()
    trajs = expert_episodes(run, rows, 1, masked=True)
    rollout_s = time.time() - t
    run.renderer.forget()
    once_s, equal = 0.0, 0
    for traj in trajs:
        t = time.time()
        once = run.renderer.render(list(traj.messages))
        once_s += time.time() - t
        seen = tuple(traj.prompt_ids) + tuple(traj.response_ids)
        equal += tuple(once.token_ids[: len(seen)]) == seen and torch.equal(once.pixel_values, traj.pixel_values)
    run.close()
    turns = sum(len(traj.turns) for traj in trajs)
    entry = {"level": args.level, "rows": args.rows, "model": args.model, "turns": turns, "ids_equal": equal}
    entry |= {"rollout_path_s": round(rollout_s, 2), "render_once_s": round(once_s, 2)}
    entry |= {"rollout_ms_per_turn": round(1000 * rollout_s / turns, 2), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(entry))
    append_run(
        args.out,
        "an expert batch rendered per turn and once (expert_render_once.py)",
        entry,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
