"""BFS over a maze grid: the shortest path and the expert action sequence (for SFT data)."""

from __future__ import annotations

from collections import deque

import numpy as np

from vlrl.envs.maze2d import DELTAS, STOP


def shortest_path_actions(maze_map: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[int]:
    """Move actions (0 right, 1 up, 2 left, 3 down) along a shortest path from ``start`` to ``goal``.

    ``maze_map`` is ``[H, W]`` with 1 = wall. Raises ValueError if the goal is unreachable.
    """
    start, goal = (int(start[0]), int(start[1])), (int(goal[0]), int(goal[1]))
    came: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for action, (dr, dc) in DELTAS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt not in came and maze_map[nxt] == 0:
                came[nxt] = (cell, action)
                queue.append(nxt)
    if goal not in came:
        raise ValueError(f"goal {goal} is unreachable from {start}")
    actions: list[int] = []
    cell = goal
    while (step := came[cell]) is not None:
        cell, action = step
        actions.append(action)
    return actions[::-1]


def expert_actions(maze_map: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[int]:
    """The expert episode: a shortest path followed by ``stop`` (action 4)."""
    return shortest_path_actions(maze_map, start, goal) + [STOP]
