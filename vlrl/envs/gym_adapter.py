"""``gym/<id>``: any gymnasium env with ``render_mode="rgb_array"`` and ``Discrete`` actions as a vlrl env.

The policy answers ``<action>KEYWORD</action>`` (last tag wins, case-insensitive); a keyword map
turns the keyword into the gymnasium action. Rewards are the gym env's per-step rewards, so the
episode return is the gym return. Shipped configurations: FrozenLake-v1, CliffWalking-v1, Taxi-v4
(:data:`SHIPPED`); users add theirs with :func:`register_gym_env`, or put ``keywords`` (and
optionally ``prompt``, ``max_turns``, ``make_kwargs``) in a row's extras for ``env_class="gym/<id>"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vlrl.envs.contract import EnvError
from vlrl.envs.text_env import GymTextEnv, ParsedAction

_KEYWORD = re.compile(r"<action>\s*([\w-]{1,32})\s*</action>", re.IGNORECASE)


@dataclass(frozen=True)
class GymEnvConfig:
    """How to drive one gymnasium env by text.

    gym_id: the id for ``gymnasium.make``.
    keywords: keyword -> Discrete action.
    task: what the policy is told about the task (the action format line is appended).
    max_turns: turns per episode.
    make_kwargs: extra keyword arguments for ``gymnasium.make``.
    """

    gym_id: str
    keywords: Mapping[str, int]
    task: str
    max_turns: int = 30
    make_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def prompt(self) -> str:
        words = ", ".join(self.keywords)
        return (f"{self.task}\n\nEnd your response with your chosen action in this exact format: "
                f"<action>ACTION</action> where ACTION is one of: {words}.")


SHIPPED: dict[str, GymEnvConfig] = {
    "FrozenLake-v1": GymEnvConfig(
        "FrozenLake-v1", {"left": 0, "down": 1, "right": 2, "up": 3},
        "You are the elf on a frozen lake seen from above. Walk to the gift without falling into a hole. "
        "The ice is not slippery: every move goes where you ask. Each move takes one action.",
        max_turns=20, make_kwargs={"map_name": "4x4", "is_slippery": False}),
    "CliffWalking-v1": GymEnvConfig(
        "CliffWalking-v1", {"up": 0, "right": 1, "down": 2, "left": 3},
        "You are the figure on a grid seen from above. Walk from the bottom-left start to the goal at the "
        "bottom right without stepping off the cliff along the bottom edge. Every move costs 1; the cliff "
        "costs 100 and sends you back to the start.", max_turns=30),
    "Taxi-v4": GymEnvConfig(
        "Taxi-v4", {"south": 0, "north": 1, "east": 2, "west": 3, "pickup": 4, "dropoff": 5},
        "You drive the taxi in a 5x5 city seen from above. Drive to the passenger, pick them up, drive to "
        "the destination and drop them off. Every action costs 1, a wrong pickup or dropoff costs 10, a "
        "successful dropoff earns 20.", max_turns=30),
}


def keyword_parser(keywords: Mapping[str, int]):
    """Parser for ``<action>KEYWORD</action>`` over a keyword map (keywords compared lowercased)."""
    table = {k.lower(): int(v) for k, v in keywords.items()}
    words = ", ".join(keywords)
    refusal = ("Action parsing failed. Could not find a valid action in your response.\nPlease end your "
               f"response with <action>ACTION</action> where ACTION is one of: {words}")

    def parse(text: str) -> ParsedAction:
        matches = _KEYWORD.findall(text)
        if matches and matches[-1].lower() in table:
            word = matches[-1].lower()
            return ParsedAction(table[word], word)
        return ParsedAction(None, feedback=refusal)

    return parse


def make_gym_env(config: GymEnvConfig, seed: int | None, max_turns: int | None = None) -> GymTextEnv:
    """Build the text env for a config (``gymnasium.make(..., render_mode="rgb_array")``)."""
    import gymnasium as gym

    try:
        gym_env = gym.make(config.gym_id, render_mode="rgb_array", **dict(config.make_kwargs))
    except gym.error.Error as exc:
        raise EnvError(f"gym/{config.gym_id}: gymnasium.make failed: {exc}") from None
    n = getattr(gym_env.action_space, "n", None)
    bad = [k for k, v in config.keywords.items() if n is None or not 0 <= int(v) < int(n)]
    if bad:
        gym_env.close()
        raise EnvError(f"gym/{config.gym_id}: keywords {bad} map outside the action space {gym_env.action_space}")
    return GymTextEnv(gym_env, parser=keyword_parser(config.keywords), prompt=config.prompt(),
                      max_turns=int(max_turns or config.max_turns), seed=seed, env_class=f"gym/{config.gym_id}",
                      example_actions=[f"<action>{k}</action>" for k in config.keywords])


def register_gym_env(config: GymEnvConfig, *, replace: bool = False) -> str:
    """Register ``gym/<gym_id>`` in the vlrl registry; returns the env_class name."""
    from vlrl.envs.registry import register_env

    name = f"gym/{config.gym_id}"

    def factory(extras: Mapping[str, Any], seed: int | None) -> GymTextEnv:
        return make_gym_env(config, seed, extras.get("max_turns"))

    register_env(name, factory, replace=replace)
    return name


def make_gym_env_from_extras(gym_id: str, extras: Mapping[str, Any], seed: int | None) -> GymTextEnv:
    """An unregistered ``gym/<id>`` built from row extras (``keywords`` required)."""
    if not isinstance(extras.get("keywords"), Mapping) or not extras["keywords"]:
        raise EnvError(f"gym/{gym_id} is not registered; give extras['keywords'] "
                       "(keyword -> action id) or call register_gym_env")
    config = GymEnvConfig(gym_id, dict(extras["keywords"]),
                          str(extras.get("prompt", f"You control the {gym_id} environment shown in the image.")),
                          int(extras.get("max_turns", 30)), dict(extras.get("make_kwargs", {})))
    return make_gym_env(config, seed)
