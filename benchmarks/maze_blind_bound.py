"""The best success on maze2d/5x5 of a policy that does not read the image (exhaustive, exact).

    python benchmarks/maze_blind_bound.py [--mazes 2000] [--turns 8]

A 5x5 maze is one of 16 layouts (the 4 spanning trees of its 2 x 2 cells, times 4 start corners, the goal in
the opposite one). A blind policy sees only its own moves and the feedback (moved, or "Cannot move into a
wall."); its best expected success is a search over the belief sets (which layouts, at which tiles, agree
with the history so far) under the turn budget (``stop`` is a turn). Printed for: blind; blind but knowing the
start tile (what the corner alone tells); the whole image (every layout told apart: 1.0). Layouts are
weighted as the env draws them (``--mazes`` seeds).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.envs.maze2d import DELTAS, Maze2DEnv
from vlrl.envs.maze_text import LEVELS

State = tuple[tuple[int, tuple[int, int]], ...]
"""A belief: (layout index, agent tile) pairs the history so far does not tell apart."""


def layouts(mazes: int) -> list[tuple[np.ndarray, tuple[int, int], tuple[int, int], int]]:
    """(map, start, goal, how many of ``mazes`` seeds drew it) of every 5x5 layout."""
    counts: collections.Counter = collections.Counter()
    maps = {}
    env = Maze2DEnv(5, 5)
    for seed in range(mazes):
        env.reset(seed=seed)
        key = (env.maze_map.tobytes(), env.agent, env.target)
        maps[key] = env.maze_map.copy()
        counts[key] += 1
    return [(maps[k], k[1], k[2], n) for k, n in sorted(counts.items())]


def best_success(found: list, start: State, turns: int) -> float:
    """Expected solved weight of the best feedback-only policy from belief ``start`` within ``turns``."""

    @cache
    def value(belief: State, left: int) -> float:
        if left == 0:
            return 0.0
        best = float(sum(found[i][3] for i, at in belief if at == found[i][2]))  # stop here
        for dr, dc in DELTAS.values():
            split: dict[bool, list] = {True: [], False: []}
            for i, (r, c) in belief:
                wall = bool(found[i][0][r + dr, c + dc] == 1)
                split[wall].append((i, (r, c) if wall else (r + dr, c + dc)))
            best = max(best, sum(value(tuple(sorted(b)), left - 1) for b in split.values() if b))
        return best

    return value(start, turns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mazes", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=LEVELS["5x5"]["max_turns"])
    args = ap.parse_args(argv)
    found = layouts(args.mazes)
    total = sum(n for *_, n in found)
    everyone = tuple(sorted((i, f[1]) for i, f in enumerate(found)))
    by_start: dict[tuple[int, int], list] = collections.defaultdict(list)
    for i, f in enumerate(found):
        by_start[f[1]].append((i, f[1]))
    known_start = sum(best_success(found, tuple(sorted(b)), args.turns) for b in by_start.values())
    row = {
        "layouts": len(found),
        "turns": args.turns,
        "blind": round(best_success(found, everyone, args.turns) / total, 4),
        "blind_knowing_the_start": round(known_start / total, 4),
        "image": 1.0,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
