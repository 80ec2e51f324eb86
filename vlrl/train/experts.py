"""Expert policies for SFT warm starts, as rollout scripts ``(env, row) -> replies``.

Each reads the env's own state (after ``init``) as the episode goes, so the expert trajectories go
through exactly the rollout path the policy's do — same renderer, splicing and batch format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

Expert = Callable[[Any, Mapping[str, Any]], Iterator[str]]


def color_square_expert(env, row) -> Iterator[str]:
    """The colour of the current square as a bare word (the env accepts it; two tokens with the
    end of turn, which a tiny model learns far faster than the tagged form)."""
    game = env.gym_env.unwrapped
    for _ in range(env.max_turns):
        yield game.names[game.colour]


def color_square_format_expert(env, row) -> Iterator[str]:
    """Right format, colour drawn at random (seeded by the row): teaches the answer format only,
    so the policy starts RL at chance and the reward has to teach it the colours."""
    import random

    game = env.gym_env.unwrapped
    rng = random.Random(row.get("seed"))
    for _ in range(env.max_turns):
        yield rng.choice(game.names)


def maze2d_expert(env, row) -> Iterator[str]:
    """A BFS shortest path to the target, then stop (in the env's action format)."""
    from vlrl.envs.maze_solver import expert_actions
    from vlrl.envs.maze_text import action_text

    game = env.gym_env.unwrapped
    mode = str((row.get("extras") or {}).get("action_mode", "keyword"))
    for action in expert_actions(game.maze_map, game.agent, game.target):
        yield action_text(action, mode)


EXPERTS: dict[str, Expert] = {"color_square": color_square_expert, "color_square/format": color_square_format_expert,
                              "maze2d": maze2d_expert}


def expert_for(name: str) -> Expert:
    """An expert by name (``maze2d`` serves every maze level)."""
    if name not in EXPERTS:
        raise KeyError(f"no expert {name!r}; experts: {', '.join(sorted(EXPERTS))}")
    return EXPERTS[name]
