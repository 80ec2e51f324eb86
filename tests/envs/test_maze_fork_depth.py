"""benchmarks/maze_fork_depth.py: a policy's errors at forks by how far it must look to see a wrong way end."""

from __future__ import annotations

import numpy as np
from bench_script import load  # tests/envs is on sys.path (as maze_cpu)


def _module():
    return load("maze_fork_depth.py")


def _t_maze() -> np.ndarray:
    """A corridor (1, 1)-(1, 7) with a stub of two tiles down from (1, 5)."""
    maze = np.ones((5, 9), dtype=np.int64)
    maze[1, 1:8] = 0
    maze[2:4, 5] = 0
    return maze


def test_a_wrong_way_is_as_deep_as_the_longest_walk_into_it():
    fd = _module()
    maze = _t_maze()
    assert fd.way_depth(maze, (1, 5), (2, 5)) == 2  # the stub
    assert fd.way_depth(maze, (1, 5), (1, 4)) == 4  # back to (1, 1)
    assert fd.way_depth(maze, (1, 3), (1, 4)) == 4  # (1, 4) on to (1, 7), or down the stub to (3, 5): 4 tiles
    assert [fd.bucket(d) for d in (1, 2, 3, 6, 7, 14, 15)] == ["1-2", "1-2", "3-6", "3-6", "7-14", "7-14", "15+"]


def test_choices_are_counted_to_the_first_mistake_with_the_deepest_wrong_way():
    fd = _module()
    maze = _t_maze()
    # at (1, 5) the path goes right, the stub (two tiles) is the wrong way; the way back (four) is no choice
    solved = {"moves": "RRRRRRS", "labels": ["ok"] * 7, "choices": [None] * 4 + ["toward", None, None]}
    assert fd.fork_depths(maze, (1, 1), (1, 7), solved) == [("toward", "1-2", False)]
    # down the stub, back up, on: the choices after the first mistake are not counted
    moves, labels = "RRRRDURR", ["ok"] * 4 + ["off_path", "ok", "ok", "ok"]
    wrong = {"moves": moves, "labels": labels, "choices": [None] * 4 + ["toward", None, "tie", None]}
    assert fd.fork_depths(maze, (1, 1), (1, 7), wrong) == [("toward", "1-2", True)]


def test_the_experts_choices_are_all_counted_and_none_is_wrong():
    from vlrl.envs.maze_solver import expert_actions, path_choices
    from vlrl.envs.maze_text import make_maze2d

    fd = _module()
    for seed in range(10):
        env = make_maze2d("hard", {}, seed)
        env.init()
        game = env.gym_env.unwrapped
        actions = expert_actions(game.maze_map, game.agent, game.target)
        kinds = [*path_choices(game.maze_map, game.agent, game.target), None]
        episode = {"moves": "".join("RULDS"[a] for a in actions), "labels": ["ok"] * len(actions), "choices": kinds}
        got = fd.fork_depths(game.maze_map, game.agent, game.target, episode)
        assert [k for k, _, _ in got] == [k for k in kinds if k is not None] and not any(w for _, _, w in got), seed
