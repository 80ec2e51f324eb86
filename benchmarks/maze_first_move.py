"""Does a model's first maze move depend on the image? The spread of its first reply token's logprob over mazes.

    python benchmarks/maze_first_move.py MODEL_DIR [MODEL_DIR ...] [--mazes 12] [--device cpu] [--tile 25]

Per model directory: greedy first turns (``max_turns`` 1) of ``--mazes`` eval mazes of maze2d/5x5 through the
trainer's own rollout; prints the first replies seen and the min, max and spread of the logprob of the reply's
4th token (the direction in ``<action>DIR</action>``). The first frame is the only thing that differs from maze
to maze, so a spread near the fp32 noise (~1e-6) means the first move ignores the image.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.envs.maze_curriculum import LevelPlan, level_config

DIRECTION = 3
"""Index of the direction token in the reply ``<``, ``action``, ``>``, DIR, ..."""


def first_move(path: str, mazes: int, device: str, tile: int) -> dict:
    from vlrl.train.run import Run

    extras = f'data.extras={{"expert_noise":0.0,"max_turns":1,"tile":{tile}}}'
    plan = LevelPlan("5x5", 0, 0, overrides=(f"model.device={device}", extras, f"data.eval_rows={mazes}"))
    run = Run(level_config(plan, "/tmp/maze_first_move", path))
    try:
        trajs = run.rollout(run.eval_rows, seed=1, temperature=0.0, repeats=1, shared=False) or []
    finally:
        run.close()
    logprobs = [t.logprobs[DIRECTION] for t in trajs]
    return {
        "model": path,
        "replies": sorted({t.turns[0].text for t in trajs}),
        "logprob_min": round(min(logprobs), 6),
        "logprob_max": round(max(logprobs), 6),
        "spread": max(logprobs) - min(logprobs),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--mazes", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tile", type=int, default=25)
    args = ap.parse_args(argv)
    for path in args.models:
        print(json.dumps(first_move(path, args.mazes, args.device, args.tile)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
