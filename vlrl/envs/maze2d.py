"""Maze2D as a ``gymnasium.Env``: the VisGym ``maze_2d`` task, written from its spec.

Grid: ``maze_map[row, col]``, 1 = wall, 0 = floor, outer ring of walls included in the size.
Cells sit at odd absolute coordinates; Wilson's loop-erased random walk carves a uniform spanning
tree over them (a perfect maze: one path between any two tiles). Start and goal sit on opposite
interior corners. Frames are ``[H*25, W*25, 3]`` uint8: floor white, wall gray, goal tile red,
agent a blue disc of radius 6.25 px at its tile centre. ``tile`` changes the 25 px tile (the disc keeps
a quarter of it): at 28 px, a multiple of the Qwen-VL processors' 28 px merge unit, each merged vision
token covers exactly one tile, where 25 px tiles are resized and straddle token boundaries.

Actions are ``Discrete(5)``: 0 right, 1 up, 2 left, 3 down (VisGym's direction ids) and 4 stop.
Only ``stop`` ends the episode, with reward 1.0 iff the agent is on the goal. The text side
(tuple and keyword parsing, prompts) lives in :mod:`vlrl.envs.maze_text`.

Deliberate departures from the reference's quirks: ``reset`` always renders the new maze, and the
frame is redrawn from state each time (leaving the goal never leaves a white dot on it).

``start="random"`` (not VisGym's; for SFT data, never for evaluation) puts the agent on a floor tile drawn
uniformly from all but the goal, after the same draws as a corner start: the same seed, the same maze and goal.
"""

from __future__ import annotations

import random
from typing import Any, Literal, get_args

import gymnasium as gym
import numpy as np
from gymnasium import spaces

TILE = 25
FLOOR = (255, 255, 255)
WALL = (169, 169, 169)
TARGET = (255, 0, 0)
AGENT = (0, 0, 255)
AGENT_RADIUS = 6.25

STOP = 4
Start = Literal["corner", "random"]
DELTAS = {0: (0, 1), 1: (-1, 0), 2: (0, -1), 3: (1, 0)}  # action -> (d_row, d_col)
ACTION_NAMES = {0: "right", 1: "up", 2: "left", 3: "down", STOP: "stop"}

FEEDBACK_OK = "Action executed successfully."
FEEDBACK_WALL = "Cannot move into a wall."


def _disc_mask(tile: int = TILE) -> np.ndarray:
    """``[tile, tile]`` bool: pixel centres within ``tile / 4`` (AGENT_RADIUS at 25 px) of the tile centre."""
    centres = np.arange(tile) + 0.5
    dy, dx = np.meshgrid(centres - tile / 2, centres - tile / 2, indexing="ij")
    radius = AGENT_RADIUS * tile / TILE
    return dy * dy + dx * dx <= radius * radius


DISC = _disc_mask()


def generate_maze(height: int, width: int, rng: random.Random) -> np.ndarray:
    """A perfect maze ``[height, width]`` int8 (1 wall, 0 floor) by Wilson's loop-erased random walk.

    Cells are the odd coordinates inside the wall ring; a corridor tile joins two adjacent cells.
    """
    grid = np.ones((height, width), dtype=np.int8)
    cells = [(r, c) for r in range(1, height - 1, 2) for c in range(1, width - 1, 2)]
    in_tree = {cells[rng.randrange(len(cells))]}
    grid[next(iter(in_tree))] = 0
    steps = ((0, 2), (0, -2), (2, 0), (-2, 0))
    for start in cells:
        if start in in_tree:
            continue
        # Random walk until the tree is hit, remembering only the last exit from each cell:
        # following those exits from the start is the loop-erased walk.
        exit_of: dict[tuple[int, int], tuple[int, int]] = {}
        cell = start
        while cell not in in_tree:
            while True:
                dr, dc = steps[rng.randrange(4)]
                nxt = (cell[0] + dr, cell[1] + dc)
                if 0 < nxt[0] < height - 1 and 0 < nxt[1] < width - 1:
                    break
            exit_of[cell] = nxt
            cell = nxt
        cell = start
        while cell not in in_tree:
            nxt = exit_of[cell]
            grid[cell] = 0
            grid[(cell[0] + nxt[0]) // 2, (cell[1] + nxt[1]) // 2] = 0
            in_tree.add(cell)
            cell = nxt
    return grid


def corner_pair(height: int, width: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Start and goal ``(row, col)`` for corner-pair index ``k`` in 0..3 (opposite interior corners)."""
    pairs = [
        ((1, 1), (height - 2, width - 2)),
        ((height - 2, width - 2), (1, 1)),
        ((height - 2, 1), (1, width - 2)),
        ((1, width - 2), (height - 2, 1)),
    ]
    return pairs[k]


def render_background(maze_map: np.ndarray, target: tuple[int, int], tile: int = TILE) -> np.ndarray:
    """Walls, floor and the goal tile, ``[H*tile, W*tile, 3]`` uint8 (everything but the agent)."""
    colours = np.array([FLOOR, WALL], dtype=np.uint8)
    frame = np.repeat(np.repeat(colours[maze_map], tile, axis=0), tile, axis=1)
    tr, tc = target
    frame[tr * tile : (tr + 1) * tile, tc * tile : (tc + 1) * tile] = TARGET
    return frame


def render_maze(
    maze_map: np.ndarray,
    agent: tuple[int, int],
    target: tuple[int, int],
    background: np.ndarray | None = None,
    tile: int = TILE,
) -> np.ndarray:
    """The frame ``[H*tile, W*tile, 3]`` uint8 for a maze state (``background`` reused when given)."""
    frame = render_background(maze_map, target, tile) if background is None else background.copy()
    ar, ac = agent
    cell = frame[ar * tile : (ar + 1) * tile, ac * tile : (ac + 1) * tile]
    cell[DISC if tile == TILE else _disc_mask(tile)] = AGENT
    return frame


class Maze2DEnv(gym.Env):
    """The VisGym maze as a gymnasium env; see the module docstring. Sizes must be odd and >= 5; ``tile``
    (px per maze tile, VisGym's 25 by default) at least 4."""

    metadata = {"render_modes": ["rgb_array", "ansi"], "render_fps": 4}

    def __init__(
        self,
        maze_width: int = 11,
        maze_height: int = 11,
        render_mode: str | None = "rgb_array",
        tile: int = TILE,
        start: Start = "corner",
    ):
        if maze_width % 2 == 0 or maze_height % 2 == 0 or min(maze_width, maze_height) < 5:
            raise ValueError(f"maze sizes must be odd and >= 5, got {maze_height}x{maze_width}")
        if isinstance(tile, bool) or not isinstance(tile, int) or tile < 4:
            raise ValueError(f"maze tile must be an int of at least 4 px, got {tile!r}")
        if start not in get_args(Start):
            raise ValueError(f"maze start must be 'corner' or 'random', got {start!r}")
        self.width, self.height, self.tile, self.start = int(maze_width), int(maze_height), tile, start
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(5)
        self.observation_space = spaces.Box(0, 255, (self.height * tile, self.width * tile, 3), np.uint8)
        self.maze_map = np.ones((self.height, self.width), dtype=np.int8)
        self.agent = (1, 1)
        self.target = (self.height - 2, self.width - 2)
        self._background = render_background(self.maze_map, self.target, tile)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """New maze from ``np_random`` (re-seeded by ``seed``); ``options={"init_state": {...}}`` restores one."""
        super().reset(seed=seed)
        state = (options or {}).get("init_state")
        if state is not None:
            self.maze_map = np.asarray(state["maze_map"], dtype=np.int8).copy()
            row, col = (int(v) for v in state["agent_location"])
            self.agent = (row, col)
            row, col = (int(v) for v in state["target_location"])
            self.target = (row, col)
        else:
            walk_rng = random.Random(int(self.np_random.integers(2**32)))
            self.maze_map = generate_maze(self.height, self.width, walk_rng)
            self.agent, self.target = corner_pair(self.height, self.width, int(self.np_random.integers(0, 4)))
            if self.start == "random":
                floor = [(int(r), int(c)) for r, c in np.argwhere(self.maze_map == 0) if (r, c) != self.target]
                self.agent = floor[int(self.np_random.integers(0, len(floor)))]
        self._background = render_background(self.maze_map, self.target, self.tile)  # static per maze: drawn once
        return self._obs(), self._info(FEEDBACK_OK)

    def step(self, action: int):
        action = int(action)
        if action == STOP:
            reward = 1.0 if self.agent == self.target else 0.0
            return self._obs(), reward, True, False, self._info(FEEDBACK_OK)
        dr, dc = DELTAS[action]
        nxt = (self.agent[0] + dr, self.agent[1] + dc)
        if self.maze_map[nxt] == 1:
            return self._obs(), 0.0, False, False, self._info(FEEDBACK_WALL)
        self.agent = nxt
        return self._obs(), 0.0, False, False, self._info(FEEDBACK_OK)

    def render(self):
        if self.render_mode == "ansi":
            return self.ansi()
        return self._obs()

    def ansi(self) -> str:
        """Text picture: ``#`` wall, space floor, ``A`` agent, ``T`` target, plus a ``#`` border."""
        rows = []
        for r in range(self.height):
            line = "".join("#" if v else " " for v in self.maze_map[r])
            for (rr, cc), ch in ((self.target, "T"), (self.agent, "A")):
                if rr == r:
                    line = line[:cc] + ch + line[cc + 1 :]
            rows.append("#" + line + "#")
        border = "#" * (self.width + 2)
        return "\n".join([border, *rows, border])

    def get_init_state(self) -> dict[str, Any]:
        """The exact state, restorable with ``reset(options={"init_state": ...})``."""
        return {
            "maze_map": self.maze_map.tolist(),
            "agent_location": list(self.agent),
            "target_location": list(self.target),
        }

    def _obs(self) -> np.ndarray:
        return render_maze(self.maze_map, self.agent, self.target, self._background, self.tile)

    def _info(self, feedback: str) -> dict[str, Any]:
        distance = abs(self.agent[0] - self.target[0]) + abs(self.agent[1] - self.target[1])
        return {
            "distance": distance,
            "agent": self.agent,
            "target": self.target,
            "maze_map": self.maze_map.copy(),
            "env_feedback": feedback,
        }
