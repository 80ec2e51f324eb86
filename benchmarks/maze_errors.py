"""Where a maze policy goes wrong: each greedy eval episode replayed move by move against the BFS expert's move.

    python benchmarks/maze_errors.py WEIGHTS [--level easy] [--mazes 100] [--device cpu] [--max-turns 20]
        [--temperature 0.5] [--out benchmarks/results/maze_errors_cpu.json] [--chunk 50] [--episodes eps.jsonl]

Runs the curriculum's own evaluation (``greedy_rollouts``; ``--temperature`` > 0 samples instead, seeded as the
eval is, so a rerun gives the same episodes) on the level's first ``--mazes`` eval mazes, then replays
each episode's replies in a fresh env of the same seed and labels every turn:

- ``ok``: the shortest path's move (``stop`` on the goal);
- ``off_path``: a move onto a floor tile off the shortest path (a wrong branch at a fork, or away from the goal);
- ``wall``: a move into a wall (the frame does not change);
- ``stop_off_goal`` / ``unparsed``.

Reports the share of ``ok`` turns, the first mistake's kind and turn in each episode that has one, how many solved
episodes made a mistake and recovered, how many were solved within ``--max-turns`` or else VisGym's number of turns
(``vlrl.envs.maze_text.VISGYM_TURNS``, which says how that differs from a run under that budget; the small levels:
their own), the failed episodes' moves as letters (R U L D, S for stop), and at the choices on the way (two or
more ways on) whether heading for the goal picks the right way, ties or turns from it, and how often each went
wrong, how many moves each failed episode still had to go where it ended (``failed_left_to_goal``), how many mazes
have a path that with its ``stop`` fits the budget and how many of those were solved within it (``fit_budget``,
``solved_of_fitting``: the rest cannot be solved in time), and what the
agent took on coming back to a tile it had left by a wrong way (``returns``: :func:`returns`). Appends the run to
``--out``; on CPU ~1 s an easy episode for the small model (198 s for 200 of a 91 %
policy, 50 at a time).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LETTERS = "RULDS"  # action order of vlrl.envs.maze2d: 0 right, 1 up, 2 left, 3 down, 4 stop


def label_turns(env, replies: list[str]) -> tuple[str, list[str], list[str | None]]:
    """Replay ``replies`` in ``env`` (a fresh ``make_maze2d`` env, not yet started): (moves as letters, labels,
    each turn's :func:`vlrl.envs.maze_solver.choice_kind`)."""
    from vlrl.envs.maze2d import STOP
    from vlrl.envs.maze_solver import choice_kind, shortest_path_actions

    env.init()
    game = env.gym_env.unwrapped
    letters, labels, choices = "", [], []
    came_from = None
    for text in replies:
        path = shortest_path_actions(game.maze_map, game.agent, game.target)
        best = path[0] if path else STOP
        before = game.agent
        choices.append(choice_kind(game.maze_map, before, came_from, best, game.target))
        action = env.parser(text).action
        result = env.step(text)
        letters += "?" if action is None else LETTERS[action]
        if action is None:
            labels.append("unparsed")
        elif action == best:
            labels.append("ok")
        elif action == STOP:
            labels.append("stop_off_goal")
        else:
            labels.append("wall" if game.agent == before else "off_path")
        came_from = before if game.agent != before else came_from
        if result.done:
            break
    return letters, labels, choices


def tiles(maze_map, start: tuple[int, int], moves: str) -> list[tuple[int, int]]:
    """The agent's tile before each of ``moves`` (letters as :func:`label_turns` gives them, up to the first that is
    no move) and after the last (a wall bump stays put)."""
    from vlrl.envs.maze2d import DELTAS

    out = [start]
    for letter in moves:
        if letter not in "RULD":
            break
        (row, col), (dr, dc) = out[-1], DELTAS["RULD".index(letter)]
        step = (row + dr, col + dc)
        out.append(out[-1] if maze_map[step] == 1 else step)
    return out


def returns(maze_map, start: tuple[int, int], moves: str, labels: list[str]) -> list[str]:
    """For each turn of ``moves`` and ``labels`` (as :func:`label_turns` gives them) that finds the agent back on a
    tile it left the last time by a wrong way (``off_path``), what it took this time: ``same`` (that wrong way
    again), ``path`` (the shortest path's move) or ``other`` (another wrong way, or a wall). The frame is the same on
    each visit (the disc on that tile), so only the history tells the policy it has been down that way and come
    back; the expert's detours come back to take the path, so it goes the same wrong way again only where a new
    random detour happens to take it."""
    last: dict[tuple[int, int], tuple[str, str]] = {}
    out = []
    for cell, letter, label in zip(tiles(maze_map, start, moves), moves, labels, strict=False):
        if letter not in "RULD":
            break
        if last.get(cell, ("", ""))[1] == "off_path":  # back: an off_path move left the tile (a bump is "wall")
            out.append("same" if last[cell][0] == letter else "path" if label == "ok" else "other")
        last[cell] = (letter, label)
    return out


def replay_facts(env, moves: str, labels: list[str]) -> dict:
    """In ``env``'s maze (a fresh ``make_maze2d`` env, not yet started): the episode's :func:`returns`, how many
    moves the shortest path still had to go where it ended (``left``; 0 on the goal), and the fewest turns that solve
    the maze (``fewest_turns``: the expert's episode, its path and ``stop``)."""
    from vlrl.envs.maze_solver import expert_actions, shortest_path_actions

    env.init()
    game = env.gym_env.unwrapped
    end = tiles(game.maze_map, game.agent, moves)[-1]
    left = len(shortest_path_actions(game.maze_map, end, game.target))
    fewest = len(expert_actions(game.maze_map, game.agent, game.target))
    return {"returns": returns(game.maze_map, game.agent, moves, labels), "left": left, "fewest_turns": fewest}


def with_budget(rows: list, max_turns: int | None) -> list:
    """``rows`` with their turn budget set (row extras ``max_turns``; the step counter then names it), or as they
    are for None."""
    if max_turns is None:
        return list(rows)
    return [dataclasses.replace(r, extras={**r.extras, "max_turns": max_turns}) for r in rows]


def choice_counts(episodes: list[dict]) -> dict:
    """Over each episode's turns up to its first mistake (the agent on the shortest path until then): how many
    were choices of each ``choice_kind`` and how many of each went wrong (``choices_on_the_path``: kind -> [turns,
    wrong]), and where the first mistakes fell (``first_mistake_at``: a choice's kind, or ``corridor``). Episodes
    without ``choices`` count as all corridor."""
    seen: dict[str, list[int]] = {"toward": [0, 0], "tie": [0, 0], "away": [0, 0]}
    at: collections.Counter = collections.Counter()
    for e in episodes:
        kinds = e.get("choices") or [None] * len(e["labels"])
        for label, kind in zip(e["labels"], kinds, strict=True):
            if kind is not None:
                seen[kind][0] += 1
                seen[kind][1] += label != "ok"
            if label != "ok":
                at[kind or "corridor"] += 1
                break
    return {"choices_on_the_path": seen, "first_mistake_at": dict(at)}


def summarise(episodes: list[dict], budget: int) -> dict:
    """The run's counts from per-episode ``{"solved", "moves", "labels"[, "stop"]}``; ``budget``: the turns to count
    ``solved_within_budget`` against (``vlrl.envs.maze_text.VISGYM_TURNS``)."""
    turns = [label for e in episodes for label in e["labels"]]
    first = [
        next((i, x) for i, x in enumerate(e["labels"]) if x != "ok") for e in episodes if set(e["labels"]) - {"ok"}
    ]
    failed = [e for e in episodes if not e["solved"]]
    return {
        **choice_counts(episodes),
        "solved": len(episodes) - len(failed),
        "episodes": len(episodes),
        "turns": len(turns),
        "ok_share": round(turns.count("ok") / max(1, len(turns)), 4),
        "labels": dict(collections.Counter(turns)),
        "with_a_mistake": len(first),
        "solved_after_a_mistake": sum(e["solved"] and set(e["labels"]) != {"ok"} for e in episodes),
        "first_mistake": dict(collections.Counter(kind for _, kind in first)),
        "first_mistake_turn": dict(sorted(collections.Counter(i for i, _ in first).items())),
        "solved_turns": dict(sorted(collections.Counter(len(e["labels"]) for e in episodes if e["solved"]).items())),
        "budget": budget,
        "solved_within_budget": sum(e["solved"] and len(e["labels"]) <= budget for e in episodes),
        **fitting(episodes, budget),
        "failed_moves": [e["moves"] for e in failed],
        # "length": the model's context ended it (its last reply cut short, so "unparsed": a "?" in the moves)
        "stop_reasons": dict(collections.Counter(e.get("stop", "unrecorded") for e in episodes)),
        "returns": return_counts(episodes),
        "returns_failed": return_counts(failed),
        # how far from the goal the failures ended: near ones ran out of turns, far ones lost the way
        "failed_left_to_goal": dict(sorted(collections.Counter(e.get("left") for e in failed if "left" in e).items())),
    }


def fitting(episodes: list[dict], budget: int) -> dict[str, int]:
    """The mazes whose expert episode (shortest path and ``stop``) fits ``budget`` turns (``fit_budget``; the others
    cannot be solved within it) and how many of them were solved within it (``solved_of_fitting``); ``{}`` when the
    episodes carry no ``fewest_turns`` (:func:`replay_facts`)."""
    if not episodes or any("fewest_turns" not in e for e in episodes):
        return {}
    fits = [e for e in episodes if e["fewest_turns"] <= budget]
    return {"fit_budget": len(fits), "solved_of_fitting": sum(e["solved"] and len(e["labels"]) <= budget for e in fits)}


def return_counts(episodes: list[dict]) -> dict[str, int]:
    """How often each episode's returns (:func:`returns`) took the same wrong way, the path, or another way."""
    return dict(collections.Counter(kind for e in episodes for kind in e.get("returns", [])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", help="a model directory (a level's weights, or weights_parts.py unpacked)")
    ap.add_argument("--level", default="easy")
    ap.add_argument("--mazes", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-turns", type=int, default=None, help="the episodes' turn budget (default: the level's)")
    ap.add_argument("--temperature", type=float, default=0.0, help="the episodes' sampling temperature (0: greedy)")
    ap.add_argument("--out", default="benchmarks/results/maze_errors_cpu.json")
    ap.add_argument(
        "--chunk",
        type=int,
        default=50,
        help="episodes rolled out at once, greedy (200 easy ones at once held 16-17.7 GB, 50: 11.8)",
    )
    ap.add_argument("--episodes", default=None, help="also write each episode's seed, moves and labels here (JSONL)")
    args = ap.parse_args(argv)

    from maze_perception import append_run, weights_config

    from vlrl.envs.maze_curriculum import greedy_rollouts
    from vlrl.envs.maze_models import checkpoint_choices
    from vlrl.envs.maze_text import LEVELS, VISGYM_TURNS, make_maze2d
    from vlrl.train.run import Run

    t0 = time.time()
    cfg = weights_config(args.level, args.weights, args.device, "/tmp/maze_errors")
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, eval_temperature=args.temperature))
    run = Run(cfg)
    try:
        rows = with_budget(run.eval_rows[: args.mazes], args.max_turns)
        trajs = [t for i in range(0, len(rows), args.chunk) for t in greedy_rollouts(run, rows[i : i + args.chunk])]
    finally:
        run.close()
    episodes = []
    for row, traj in zip(rows, trajs, strict=True):
        replies = [turn.text for turn in traj.turns]
        moves, labels, choices = label_turns(make_maze2d(args.level, row.extras, row.seed), replies)
        facts = replay_facts(make_maze2d(args.level, row.extras, row.seed), moves, labels)
        episodes.append(
            {"seed": row.seed, "solved": traj.total_reward > 0, "moves": moves, "labels": labels, "choices": choices}
            | {"stop": traj.stop_reason}
            | facts
        )
    if args.episodes:
        Path(args.episodes).write_text("".join(json.dumps(e) + "\n" for e in episodes))
    budget = args.max_turns or VISGYM_TURNS.get(args.level, LEVELS[args.level]["max_turns"])
    summary = summarise(episodes, budget)
    for key, value in summary.items():
        print(key, value, flush=True)
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    record = {
        "command": f"python benchmarks/maze_errors.py {argv_text}",
        **vars(args),
        **checkpoint_choices(args.weights),
    }
    append_run(args.out, __doc__.strip().splitlines()[0], record | summary | {"wall_s": round(time.time() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
