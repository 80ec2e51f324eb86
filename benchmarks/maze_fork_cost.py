"""What ``--fork-mazes`` costs a builder: one easy batch of 64 expert episodes built in this process, the rows as
drawn against picked by ``fork_rows`` (share 0.5 of 8 candidates a row), alternating, on the tiny model's renderer;
and a census of the expert's paths: per level, over seeds 0..N-1 (seeds 0-199 are the eval mazes), the forks of
each ``choice_kind``, the mazes with an away fork, the expert's moves with and without one, and ``has_away_fork``'s
milliseconds a maze.

    python benchmarks/maze_fork_cost.py [--reps 3] [--census 600] [--json benchmarks/results/maze_fork_cost_cpu.json]

Per batch: the seconds picking took, the whole build's seconds (picking included) and the episodes' turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def census(level: str, seeds: int) -> dict:
    """The expert's paths through ``level``'s mazes of seeds 0..``seeds``-1 (module docstring)."""
    import collections
    import statistics

    from vlrl.data.tickets import make_rows
    from vlrl.envs.maze_sft_data import has_away_fork
    from vlrl.envs.maze_solver import path_choices
    from vlrl.envs.maze_text import make_maze2d

    rows = make_rows(f"maze2d/{level}", list(range(seeds)), {})
    kinds: collections.Counter = collections.Counter()
    moves: dict[bool, list[int]] = {True: [], False: []}
    for row in rows:
        env = make_maze2d(level, row.extras, row.seed)
        env.init()
        game = env.gym_env.unwrapped
        path = path_choices(game.maze_map, game.agent, game.target)
        kinds.update(k for k in path if k is not None)
        moves["away" in path].append(len(path))
    t = time.time()
    flags = [has_away_fork(r) for r in rows]
    mean = lambda xs: round(statistics.mean(xs), 2) if xs else None  # noqa: E731
    return {
        "level": level,
        "seeds": seeds,
        "choices": dict(kinds),
        "mazes_with_away": sum(flags),
        "moves_with_away": mean(moves[True]),
        "moves_without": mean(moves[False]),
        "has_away_fork_ms": round((time.time() - t) / seeds * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--census", type=int, default=600, help="seeds per level in the census (0: none)")
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
    levels = [census(level, n) for level in ("5x5", "7x7", "easy") for n in (200, args.census) if n]
    for row in levels:
        print(row, flush=True)
    command = "python benchmarks/maze_fork_cost.py " + " ".join(argv or sys.argv[1:])
    record = {"command": command, "batches": batches, "census": levels}
    Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
