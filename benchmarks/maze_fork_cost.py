"""What ``--fork-mazes`` costs a builder: one easy batch of 64 expert episodes built in this process, the rows as
drawn against picked by ``fork_rows`` (share 0.5 of 8 candidates a row), alternating, on the tiny model's renderer.

    python benchmarks/maze_fork_cost.py [--reps 3] [--json benchmarks/results/maze_fork_cost_cpu.json]

Per batch: the seconds picking took, the whole build's seconds (picking included) and the episodes' turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="benchmarks/results/maze_fork_cost_cpu.json")
    args = ap.parse_args(argv)

    from vlrl.envs.maze_curriculum import LevelPlan, level_config
    from vlrl.envs.maze_sft_data import expert_episodes, fork_rows
    from vlrl.train.run import Run

    extras = '{"expert_noise":0.15,"expert_branch":0.15}'
    sets = ("model.device=cpu", "sft.rows_per_step=64", "data.train_rows=20000", f"data.extras={extras}")
    run = Run(level_config(LevelPlan("easy", 600, 0, overrides=sets), "/tmp/maze_fork_cost"))
    batches = []
    try:
        for rep in range(args.reps):
            for share, draw in ((0.0, 1), (0.5, 8)):
                rows = run.next_rows(64 * draw)
                t = time.time()
                picked = fork_rows(rows, 64, share) if share else rows
                pick_s = time.time() - t
                turns = sum(len(tr.turns) for tr in expert_episodes(run, picked, rep, masked=True))
                batch = {"share": share, "draw": draw, "rep": rep, "pick_s": round(pick_s, 2)}
                batches.append(batch | {"build_s": round(time.time() - t, 2), "turns": turns})
                print(batches[-1], flush=True)
    finally:
        run.close()
    record = {"command": "python benchmarks/maze_fork_cost.py " + " ".join(argv or sys.argv[1:]), "batches": batches}
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
