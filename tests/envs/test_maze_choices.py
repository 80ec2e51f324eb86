"""What heading for the goal would pick at a maze path's forks (``vlrl.envs.maze_solver.choice_kind``,
``path_choices``): where a maze policy goes wrong (docs/maze.md item 28)."""

from __future__ import annotations

import numpy as np

from vlrl.envs.maze_solver import choice_kind, path_choices

RIGHT, UP, LEFT, DOWN, STOP = 0, 1, 2, 3, 4


def _t_maze() -> np.ndarray:
    """A T at (2, 2): left (2, 1), up (1, 2), right (2, 3) and down (3, 2) are floor."""
    maze = np.ones((5, 5), dtype=np.int8)
    for cell in [(2, 1), (2, 2), (2, 3), (1, 2), (3, 2)]:
        maze[cell] = 0
    return maze


def test_a_fork_is_named_by_what_heading_for_the_goal_would_pick():
    maze = _t_maze()
    kind = lambda best, goal, came=(3, 2): choice_kind(maze, (2, 2), came, best, goal)  # noqa: E731
    assert kind(RIGHT, (2, 4)) == "toward"  # only right nears (2, 4)
    assert kind(RIGHT, (1, 3)) == "tie"  # up nears (1, 3) too
    assert kind(LEFT, (1, 3)) == "away"
    assert kind(STOP, (2, 2)) is None
    assert choice_kind(maze, (1, 2), None, DOWN, (3, 2)) is None  # a dead end: one way on
    maze[1, 1] = 0  # (1, 2) is now a bend: down to the T, left to (1, 1)
    assert choice_kind(maze, (1, 2), (2, 2), LEFT, (1, 1)) is None  # the tile it came from is no way on
    assert choice_kind(maze, (1, 2), None, LEFT, (1, 1)) == "toward"  # at the start both are


def test_the_paths_choices_follow_the_agent_along_the_shortest_path():
    maze = _t_maze()
    maze[1, 3] = 0  # (1, 2) -> (1, 3): up from the T, then right
    # from the bottom: a corridor tile, then the T (up and right both near (1, 3)), then (1, 2) entered from below
    assert path_choices(maze, (3, 2), (1, 3)) == [None, "tie", None]
    # a U: from (3, 2) left to (3, 1), where up (the way round to the goal) and down (a dead end) both turn away
    u = np.ones((6, 6), dtype=np.int8)
    for cell in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 4), (3, 1), (3, 2), (3, 4), (4, 1)]:
        u[cell] = 0
    assert path_choices(u, (3, 2), (3, 4)) == [None, "away", None, None, None, None, None, None]


def test_a_batch_picks_its_share_of_away_fork_mazes_from_the_candidates_and_the_rest_in_order():
    from vlrl.data.tickets import make_rows
    from vlrl.envs.maze_sft_data import fork_rows, has_away_fork

    rows = make_rows("maze2d/easy", list(range(120)), {"expert_branch": 0.15})
    away = [r for r in rows if has_away_fork(r)]
    assert 4 <= len(away) <= 30  # about 10 % of easy mazes (61 of seeds 0-599)
    picked = fork_rows(rows, 8, 0.5)
    assert picked[:4] == away[:4]  # the first four with such a fork, in the order drawn
    assert picked[4:] == [r for r in rows if r not in away[:4]][:4]  # then the others as they come
    assert fork_rows(rows, 8, 0.0) == rows[:8]  # share 0: the rows as drawn
    few = rows[: rows.index(away[1])]  # candidates with only one such maze
    assert fork_rows(few, 4, 1.0) == [away[0], *[r for r in few if r is not away[0]][:3]]
    assert all(has_away_fork(r) for r in fork_rows(rows, 6, 1.0))


def test_the_command_line_reads_fork_mazes_as_a_share_and_a_draw(tmp_path):
    import argparse
    import subprocess
    import sys

    import pytest
    from bench_script import BENCHMARKS, load  # tests/envs is on sys.path (as maze_cpu)

    script = BENCHMARKS / "maze_curriculum.py"
    mod = load("maze_curriculum.py", "maze_curriculum_cli")
    assert mod.forks_arg("0.5:6") == (0.5, 6) and mod.forks_arg("0:1") == (0.0, 1) and mod.forks_arg("1:4") == (1.0, 4)
    for bad in ("0.5", "2:6", "-0.1:6", "0.5:0", "a:6", "0.5:x", "nan:6"):
        with pytest.raises(argparse.ArgumentTypeError, match="SHARE:DRAW"):
            mod.forks_arg(bad)
    args = [sys.executable, str(script), "--out", str(tmp_path), "--plan", "easy:1:0", "--fork-mazes", "50:6"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith("got '50:6'")
    assert not any(tmp_path.iterdir())  # nothing ran
