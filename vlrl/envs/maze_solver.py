"""BFS over a maze grid: the shortest path and the expert action sequence (for SFT data), and what heading for the
goal would pick at the path's forks (where a maze policy goes wrong: docs/maze.md item 28)."""

from __future__ import annotations

from collections import deque
from typing import Literal

import numpy as np

from vlrl.envs.maze2d import DELTAS, STOP

ChoiceKind = Literal["toward", "tie", "away"]


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


def choice_kind(
    maze_map: np.ndarray, here: tuple[int, int], came_from: tuple[int, int] | None, best: int, goal: tuple[int, int]
) -> ChoiceKind | None:
    """Where the agent at ``here`` has two or more ways on (floor tiles other than the one it came from), what heading
    for the goal says of the shortest path's move ``best`` (Manhattan distance): ``"toward"`` (the one way on that
    nears the goal), ``"tie"`` (another way on nears it too) or ``"away"``; else None (a corridor, a dead end, or
    ``stop``). The mazes are trees: at such a tile one way leads to the goal."""
    if best == STOP:
        return None
    row, col = here
    gap = lambda r, c: abs(r - goal[0]) + abs(c - goal[1])  # noqa: E731
    ways = {a: (row + dr, col + dc) for a, (dr, dc) in DELTAS.items()}
    ways = {a: cell for a, cell in ways.items() if maze_map[cell] == 0 and cell != came_from}
    if len(ways) < 2:
        return None
    nearer = [a for a, cell in ways.items() if gap(*cell) < gap(row, col)]
    if best not in nearer:
        return "away"
    return "tie" if len(nearer) > 1 else "toward"


def path_choices(maze_map: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[ChoiceKind | None]:
    """:func:`choice_kind` at each move of the shortest path from ``start`` to ``goal``."""
    kinds: list[ChoiceKind | None] = []
    here, came_from = (int(start[0]), int(start[1])), None
    for action in shortest_path_actions(maze_map, start, goal):
        kinds.append(choice_kind(maze_map, here, came_from, action, goal))
        dr, dc = DELTAS[action]
        here, came_from = (here[0] + dr, here[1] + dc), here
    return kinds
