"""Registers the built-in envs and their SFT experts (imported once by the registry), and the
gymnasium ids of ours.

Env factories and experts import their modules lazily, so listing envs costs nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from vlrl.envs.registry import register_env, register_expert

GYM_IDS = {
    "vlrl/Maze2D-v0": "vlrl.envs.maze2d:Maze2DEnv",
    "vlrl/ColorSquare-v0": "vlrl.envs.color_square:ColorSquareEnv",
}


def register_with_gymnasium() -> None:
    """Make our image envs available as ``gymnasium.make("vlrl/Maze2D-v0", maze_width=9, ...)``."""
    import gymnasium as gym

    for gym_id, entry_point in GYM_IDS.items():
        if gym_id not in gym.registry:
            gym.register(id=gym_id, entry_point=entry_point)


def _lazy(path: str) -> Callable[..., Any]:
    """``module:function``, imported on the first call (the env modules pull in gymnasium, sympy, ...)."""
    module, name = path.split(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = path
    return call


def _maze(level: str):
    def factory(extras: Mapping[str, Any], seed: int | None):
        from vlrl.envs.maze_text import make_maze2d

        return make_maze2d(level, extras, seed)

    return factory


def _register() -> None:
    for level in ("5x5", "7x7", "easy", "hard"):  # vlrl.envs.maze_text.LEVELS (not imported here: lazy)
        register_env(f"maze2d/{level}", _maze(level), replace=True)
    register_env("color_square", _lazy("vlrl.envs.color_square:make_color_square"), replace=True)
    register_env("geometry", _lazy("vlrl.envs.geometry.env:make_geometry"), replace=True)
    from vlrl.envs.gym_adapter import SHIPPED, register_gym_env

    for config in SHIPPED.values():
        register_gym_env(config, replace=True)
    # Experts, each beside its env; "maze2d" serves every level (the SFT default is the env's family name).
    register_expert("maze2d", _lazy("vlrl.envs.maze_text:maze2d_expert"), replace=True)
    register_expert("color_square", _lazy("vlrl.envs.color_square:color_square_expert"), replace=True)
    register_expert("color_square/format", _lazy("vlrl.envs.color_square:color_square_format_expert"), replace=True)
    register_expert("geometry", _lazy("vlrl.envs.geometry.expert:geometry_expert"), replace=True)


_register()
