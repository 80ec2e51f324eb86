"""``gym/<id>``: any gymnasium env with ``render_mode="rgb_array"`` and ``Discrete`` actions as a vlrl env.

The policy answers ``<action>KEYWORD</action>`` (last tag wins, case-insensitive); a keyword map
turns the keyword into the gymnasium action. Rewards are the gym env's per-step rewards, so the
episode return is the gym return. Shipped configurations: FrozenLake-v1, CliffWalking-v1, Taxi-v4
(:data:`SHIPPED`); users add theirs with :func:`register_gym_env`, or put ``keywords`` (and
optionally ``prompt``, ``max_turns``, ``make_kwargs``) in a row's extras for ``env_class="gym/<id>"``.

Rows come from data, so what a row can make gymnasium do is bounded: the id must already be in
gymnasium's registry and hold no ``module:`` prefix (gymnasium would import that module), extras
hold only the keys above (a registered ``gym/<id>`` takes only ``max_turns``), and ``make_kwargs``
are the env constructor's keyword arguments with JSON values — gymnasium's own ``make`` options
(``render_mode``, ``max_episode_steps``, wrappers, …) stay the adapter's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vlrl.envs.contract import EnvError
from vlrl.envs.text_env import GymTextEnv, ParsedAction

_KEYWORD = re.compile(r"<action>\s*([\w-]{1,32})\s*</action>", re.IGNORECASE)
ROW_EXTRAS = frozenset({"keywords", "prompt", "max_turns", "make_kwargs"})
"""The extras a row may give an unregistered ``gym/<id>`` (a registered one: ``max_turns`` only)."""
MAKE_OPTIONS = frozenset(
    {
        "render_mode",
        "max_episode_steps",
        "autoreset",
        "apply_api_compatibility",
        "disable_env_checker",
        "order_enforce",
        "env_checker",
        "id",
        "kwargs",
    }
)
"""``gymnasium.make``'s own parameters: never taken from data."""
MAX_TURNS_LIMIT = 10_000


def quiet_sdl() -> None:
    """Frames come from ``render_mode="rgb_array"``: SDL needs no display, and without one it prints
    ``XDG_RUNTIME_DIR is invalid or not set`` on every pygame-rendered env. Dummy drivers, unless set."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


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
        return (
            f"{self.task}\n\nEnd your response with your chosen action in this exact format: "
            f"<action>ACTION</action> where ACTION is one of: {words}."
        )


SHIPPED: dict[str, GymEnvConfig] = {
    "FrozenLake-v1": GymEnvConfig(
        "FrozenLake-v1",
        {"left": 0, "down": 1, "right": 2, "up": 3},
        "You are the elf on a frozen lake seen from above. Walk to the gift without falling into a hole. "
        "The ice is not slippery: every move goes where you ask. Each move takes one action.",
        max_turns=20,
        make_kwargs={"map_name": "4x4", "is_slippery": False},
    ),
    "CliffWalking-v1": GymEnvConfig(
        "CliffWalking-v1",
        {"up": 0, "right": 1, "down": 2, "left": 3},
        "You are the figure on a grid seen from above. Walk from the bottom-left start to the goal at the "
        "bottom right without stepping off the cliff along the bottom edge. Every move costs 1; the cliff "
        "costs 100 and sends you back to the start.",
        max_turns=30,
    ),
    "Taxi-v4": GymEnvConfig(
        "Taxi-v4",
        {"south": 0, "north": 1, "east": 2, "west": 3, "pickup": 4, "dropoff": 5},
        "You drive the taxi in a 5x5 city seen from above. Drive to the passenger, pick them up, drive to "
        "the destination and drop them off. Every action costs 1, a wrong pickup or dropoff costs 10, a "
        "successful dropoff earns 20.",
        max_turns=30,
    ),
}


def keyword_parser(keywords: Mapping[str, int]):
    """Parser for ``<action>KEYWORD</action>`` over a keyword map (keywords compared lowercased)."""
    table = {k.lower(): int(v) for k, v in keywords.items()}
    words = ", ".join(keywords)
    refusal = (
        "Action parsing failed. Could not find a valid action in your response.\nPlease end your "
        f"response with <action>ACTION</action> where ACTION is one of: {words}"
    )

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

    quiet_sdl()
    try:
        gym_env = gym.make(config.gym_id, render_mode="rgb_array", **dict(config.make_kwargs))
    except (gym.error.Error, TypeError, ValueError) as exc:
        raise EnvError(f"gym/{config.gym_id}: gymnasium.make failed: {type(exc).__name__}: {exc}") from None
    n = getattr(gym_env.action_space, "n", None)
    bad = [k for k, v in config.keywords.items() if n is None or not 0 <= int(v) < int(n)]
    if bad:
        gym_env.close()
        raise EnvError(f"gym/{config.gym_id}: keywords {bad} map outside the action space {gym_env.action_space}")
    return GymTextEnv(
        gym_env,
        parser=keyword_parser(config.keywords),
        prompt=config.prompt(),
        max_turns=int(max_turns or config.max_turns),
        seed=seed,
        env_class=f"gym/{config.gym_id}",
        example_actions=[f"<action>{k}</action>" for k in config.keywords],
    )


def register_gym_env(config: GymEnvConfig, *, replace: bool = False) -> str:
    """Register ``gym/<gym_id>`` in the vlrl registry; returns the env_class name. Rows may set its
    ``max_turns`` and nothing else."""
    from vlrl.envs.registry import register_env

    name = f"gym/{config.gym_id}"

    def factory(extras: Mapping[str, Any], seed: int | None) -> GymTextEnv:
        _only(name, extras, {"max_turns"})
        return make_gym_env(config, seed, _max_turns(name, extras.get("max_turns")))

    register_env(name, factory, replace=replace)
    return name


def make_gym_env_from_extras(gym_id: str, extras: Mapping[str, Any], seed: int | None) -> GymTextEnv:
    """An unregistered ``gym/<id>`` built from row extras (``keywords`` required); see the module
    docstring for what a row may ask of gymnasium."""
    name = f"gym/{gym_id}"
    _check_gym_id(gym_id)
    _only(name, extras, ROW_EXTRAS)
    keywords = extras.get("keywords")
    if not isinstance(keywords, Mapping) or not keywords:
        raise EnvError(
            f"{name} is not registered; give extras['keywords'] (keyword -> action id) or call register_gym_env"
        )
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in keywords.items()):
        raise EnvError(f"{name}: extras['keywords'] must map strings to integer action ids, got {dict(keywords)!r}")
    prompt = extras.get("prompt", f"You control the {gym_id} environment shown in the image.")
    if not isinstance(prompt, str):
        raise EnvError(f"{name}: extras['prompt'] must be a string, got {type(prompt).__name__}")
    config = GymEnvConfig(gym_id, dict(keywords), prompt, make_kwargs=_make_kwargs(name, extras.get("make_kwargs", {})))
    return make_gym_env(config, seed, _max_turns(name, extras.get("max_turns")))  # None: the config's default


def _check_gym_id(gym_id: str) -> None:
    import gymnasium as gym

    if ":" in gym_id:
        raise EnvError(
            f"gym/{gym_id}: ids with a 'module:' prefix are refused (gymnasium would import the "
            "module); import it yourself and register the env, then use its plain id"
        )
    if gym_id not in gym.registry:
        raise EnvError(f"gym/{gym_id}: not in gymnasium's registry (register it before making it from a row)")


def _only(name: str, extras: Mapping[str, Any], allowed: set[str] | frozenset[str]) -> None:
    unknown = sorted(set(extras) - set(allowed))
    if unknown:
        raise EnvError(f"{name}: unknown extras {unknown}; allowed: {sorted(allowed)}")


def _max_turns(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TURNS_LIMIT:
        raise EnvError(f"{name}: extras['max_turns'] must be an integer in 1..{MAX_TURNS_LIMIT}, got {value!r}")
    return value


def _make_kwargs(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise EnvError(f"{name}: extras['make_kwargs'] must be a JSON object, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not key.isidentifier() or key in MAKE_OPTIONS:
            raise EnvError(
                f"{name}: extras['make_kwargs'] may not set {key!r} (gymnasium.make's own options "
                f"{sorted(MAKE_OPTIONS)} are the adapter's; keys are the env constructor's arguments)"
            )
        if not _is_json(item):
            raise EnvError(f"{name}: extras['make_kwargs'][{key!r}] must be a JSON value, got {type(item).__name__}")
    return dict(value)


def _is_json(value: Any, depth: int = 0) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if depth < 4 and isinstance(value, (list, tuple)):
        return all(_is_json(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_json(v, depth + 1) for k, v in value.items())
    return False
