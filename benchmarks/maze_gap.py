"""Does a maze policy solve unseen mazes as well as the ones its SFT cycled over? Greedy success of one model directory
on three sets of one level's mazes, each run by the curriculum's own evaluation (``greedy_rollouts``):

    python benchmarks/maze_gap.py WEIGHTS [--level easy] [--mazes 100] [--unseen 2000] [--device cpu]
        [--out benchmarks/results/maze_gap_cpu.json]

- ``pool``: the first ``--mazes`` training rows. A level's SFT pool is built from the training stream in order, so with
  ``--sft-fill first`` and no first-turn phase these are mazes its steps cycled over (a pool of 4 batches of 64:
  rows 0-255).
- ``unseen``: ``--mazes`` training rows from row ``--unseen`` on, which such a pool never reached.
- ``eval``: the level's fixed eval split, as the curriculum's eval (the same seeds, the same first rows).

A policy that solves its pool far better than the rest learned those mazes rather than the task: more distinct
mazes, not more passes, is then what its SFT lacks. Appends the run to ``--out``; on CPU ~1-2 s an easy
episode (small: 459 s for the three sets of 100).
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
    ap.add_argument("weights", help="a model directory (a level's weights, or weights_parts.py unpacked)")
    ap.add_argument("--level", default="easy")
    ap.add_argument("--mazes", type=int, default=100, help="mazes in each set")
    ap.add_argument("--unseen", type=int, default=2000, help="the first training row of the unseen set")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="benchmarks/results/maze_gap_cpu.json")
    args = ap.parse_args(argv)

    from maze_perception import append_run, weights_config

    from vlrl.envs.maze_curriculum import greedy_rollouts, wilson
    from vlrl.envs.maze_models import checkpoint_choices
    from vlrl.train.run import Run

    t0 = time.time()
    cfg = weights_config(args.level, args.weights, args.device, "/tmp/maze_gap")
    if args.unseen < args.mazes or args.unseen + args.mazes > cfg.data.train_rows:
        ap.error(f"--unseen {args.unseen} must leave {args.mazes} rows after the pool's and within the level's rows")
    run = Run(cfg)
    sets = {}
    try:
        rows = {"pool": run.train_rows[: args.mazes], "unseen": run.train_rows[args.unseen : args.unseen + args.mazes]}
        for name, these in (rows | {"eval": run.eval_rows[: args.mazes]}).items():
            t = time.time()
            trajs = greedy_rollouts(run, these)
            solved = sum(x.total_reward > 0 for x in trajs)
            low, high = wilson(solved, len(trajs))
            failed = [len(x.turns) for x in trajs if x.total_reward <= 0]
            sets[name] = {"solved": solved, "episodes": len(trajs), "low": round(low, 3), "high": round(high, 3)}
            sets[name] |= {"failed_turns_median": sorted(failed)[len(failed) // 2] if failed else None}
            sets[name] |= {"seconds": round(time.time() - t, 1)}
            print(name, json.dumps(sets[name]), flush=True)
    finally:
        run.close()
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    record = {"command": f"python benchmarks/maze_gap.py {argv_text}", **vars(args), **checkpoint_choices(args.weights)}
    append_run(args.out, __doc__.strip().splitlines()[0], record | {"sets": sets, "wall_s": round(time.time() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
