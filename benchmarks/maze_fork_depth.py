"""How far a maze policy must look at a fork to see a wrong way end: its errors at forks by that depth.

    python benchmarks/maze_fork_depth.py EPISODES.jsonl --level hard [--out benchmarks/results/maze_fork_depth_cpu.json]

Reads the episodes that ``benchmarks/maze_errors.py --episodes`` wrote (seed, moves, labels, choices). At each choice
on the way to an episode's first mistake (a tile with two or more ways on, as ``maze_errors.py`` counts them), the
wrong ways are the open ones other than the shortest path's and the way the agent came; the mazes are trees, so each
is a dead-end subtree, and its depth is the longest walk into it. A policy that plans only a few tiles ahead tells a
one-tile dead end from the path but not a long branch. Counts ``[choices, wrong]`` per choice kind (``toward``,
``tie``, ``away``: ``vlrl.envs.maze_solver.choice_kind``) and depth of the deepest wrong way (1-2, 3-6, 7-14, 15+
tiles), and appends them to ``--out``. Seconds on CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BUCKETS = ((2, "1-2"), (6, "3-6"), (14, "7-14"))


def way_depth(maze_map, here: tuple[int, int], first: tuple[int, int]) -> int:
    """The longest walk, in tiles, from ``here`` into the part of the maze (a tree) behind its floor tile ``first``."""
    from vlrl.envs.maze2d import DELTAS

    deepest, stack = 0, [(first, here, 1)]
    while stack:
        cell, came, depth = stack.pop()
        deepest = max(deepest, depth)
        for dr, dc in DELTAS.values():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt != came and maze_map[nxt] == 0:
                stack.append((nxt, cell, depth + 1))
    return deepest


def bucket(depth: int) -> str:
    return next((name for top, name in BUCKETS if depth <= top), "15+")


def fork_depths(
    maze_map, start: tuple[int, int], target: tuple[int, int], episode: dict
) -> list[tuple[str, str, bool]]:
    """``(kind, depth bucket, wrong)`` at each choice of ``episode`` (``moves``, ``labels``, ``choices`` as
    ``maze_errors.py`` records them) up to and including its first mistake."""
    from vlrl.envs.maze2d import DELTAS
    from vlrl.envs.maze_solver import shortest_path_actions

    out, here, came = [], start, None
    for letter, label, kind in zip(episode["moves"], episode["labels"], episode["choices"], strict=False):
        if letter not in "RULD":
            break
        if kind is not None:
            best = shortest_path_actions(maze_map, here, target)[0]
            ways = [(here[0] + dr, here[1] + dc) for a, (dr, dc) in DELTAS.items() if a != best]
            wrong = [cell for cell in ways if maze_map[cell] == 0 and cell != came]
            out.append((kind, bucket(max(way_depth(maze_map, here, cell) for cell in wrong)), label != "ok"))
        if label != "ok":
            break
        dr, dc = DELTAS["RULD".index(letter)]
        came, here = here, (here[0] + dr, here[1] + dc)  # "ok" is a move along the path, never a bump
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("episodes", help="a JSONL file that maze_errors.py --episodes wrote")
    ap.add_argument("--level", default="easy")
    ap.add_argument("--out", default="benchmarks/results/maze_fork_depth_cpu.json")
    args = ap.parse_args(argv)

    from maze_perception import append_run

    from vlrl.envs.maze_text import make_maze2d

    counts: dict[str, dict[str, list[int]]] = {}
    episodes = [json.loads(line) for line in Path(args.episodes).read_text().splitlines() if line.strip()]
    for e in episodes:
        env = make_maze2d(args.level, {}, e["seed"])
        env.init()
        game = env.gym_env.unwrapped
        for kind, depth, wrong in fork_depths(game.maze_map, game.agent, game.target, e):
            seen = counts.setdefault(kind, {}).setdefault(depth, [0, 0])
            seen[0], seen[1] = seen[0] + 1, seen[1] + wrong
    ordered = {k: {b: counts[k][b] for _, b in (*BUCKETS, (0, "15+")) if b in counts[k]} for k in sorted(counts)}
    for kind, by_depth in ordered.items():
        print(kind, " ".join(f"{b}: {w}/{n} ({w / n:.0%})" for b, (n, w) in by_depth.items()), flush=True)
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    record = {"command": f"python benchmarks/maze_fork_depth.py {argv_text}", "episodes": len(episodes)}
    append_run(args.out, __doc__.strip().splitlines()[0], record | vars(args) | {"choices_by_depth": ordered})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
