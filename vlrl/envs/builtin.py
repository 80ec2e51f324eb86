"""Registers the built-in envs (imported once by the registry) and the gymnasium ids of ours.

Factories import their env modules lazily, so listing envs costs nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlrl.envs.registry import register_env

GYM_IDS = {"vlrl/Maze2D-v0": "vlrl.envs.maze2d:Maze2DEnv",
           "vlrl/ColorSquare-v0": "vlrl.envs.color_square:ColorSquareEnv"}


def register_with_gymnasium() -> None:
    """Make our image envs available as ``gymnasium.make("vlrl/Maze2D-v0", maze_width=9, ...)``."""
    import gymnasium as gym

    for gym_id, entry_point in GYM_IDS.items():
        if gym_id not in gym.registry:
            gym.register(id=gym_id, entry_point=entry_point)


def _maze(level: str):
    def factory(extras: Mapping[str, Any], seed: int | None):
        from vlrl.envs.maze_text import make_maze2d

        return make_maze2d(level, extras, seed)

    return factory


def _color_square(extras: Mapping[str, Any], seed: int | None):
    from vlrl.envs.color_square import make_color_square

    return make_color_square(extras, seed)


def _geometry(extras: Mapping[str, Any], seed: int | None):
    from vlrl.envs.geometry.env import make_geometry

    return make_geometry(extras, seed)


def _register() -> None:
    for level in ("5x5", "7x7", "easy", "hard"):  # vlrl.envs.maze_text.LEVELS (not imported here: lazy)
        register_env(f"maze2d/{level}", _maze(level), replace=True)
    register_env("color_square", _color_square, replace=True)
    register_env("geometry", _geometry, replace=True)
    from vlrl.envs.gym_adapter import SHIPPED, register_gym_env

    for config in SHIPPED.values():
        register_gym_env(config, replace=True)


_register()
