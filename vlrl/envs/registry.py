"""The env registry: ``env_class`` name -> factory ``(extras, seed) -> Env``.

Built-in envs (maze2d/*, color_square, geometry, gym/*) register themselves the first time the
registry is consulted, so importing this module stays cheap. Users register their own envs with
the same call::

    register_env("my_env", lambda extras, seed: MyEnv(seed=seed, **extras))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vlrl.envs.contract import Env, EnvError

EnvFactory = Callable[[Mapping[str, Any], "int | None"], Env]

_REGISTRY: dict[str, EnvFactory] = {}
_BUILTINS_LOADED = False


def _ensure_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from vlrl.envs import builtin  # noqa: F401  (registers on import)


def register_env(name: str, factory: EnvFactory, *, replace: bool = False) -> None:
    """Register ``factory(extras, seed) -> Env`` under ``name``; a duplicate raises unless ``replace``."""
    if not isinstance(name, str) or not name:
        raise EnvError(f"env name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise EnvError(f"factory for {name!r} is not callable")
    if name in _REGISTRY and not replace:
        raise EnvError(f"env {name!r} is already registered; pass replace=True to override it")
    _REGISTRY[name] = factory


def unregister_env(name: str) -> None:
    """Remove a registration (tests that register envs on the fly clean up with this)."""
    _REGISTRY.pop(name, None)


def registered_envs() -> list[str]:
    """Sorted names of every registered env, built-ins included."""
    _ensure_builtins()
    return sorted(_REGISTRY)


def make_env(env_class: str, extras: Mapping[str, Any] | None = None, seed: int | None = None) -> Env:
    """Build an env from its registered name, row extras and seed (``None`` = fresh entropy).

    ``gym/<id>`` names that were never registered are built by the gymnasium adapter from
    ``extras`` (which must then carry ``keywords``; see :mod:`vlrl.envs.gym_adapter`).
    """
    _ensure_builtins()
    extras = dict(extras or {})
    factory = _REGISTRY.get(env_class)
    if factory is None and isinstance(env_class, str) and env_class.startswith("gym/"):
        from vlrl.envs.gym_adapter import make_gym_env_from_extras

        return make_gym_env_from_extras(env_class[len("gym/"):], extras, seed)
    if factory is None:
        raise EnvError(f"unknown env_class {env_class!r}; registered: {', '.join(registered_envs())}")
    return factory(extras, seed)


def env_from_row(row: Mapping[str, Any]) -> Env:
    """Build the env for a dataset row ``{prompt, env_class, extras, seed?}`` (prompt goes to ``init``)."""
    if "env_class" not in row:
        raise EnvError(f"dataset row has no 'env_class' (keys: {sorted(row)})")
    seed = row.get("seed")
    return make_env(row["env_class"], row.get("extras") or {}, None if seed is None else int(seed))


def env_factory(env_class: str, extras: Mapping[str, Any] | None = None) -> Callable[[int | None], Env]:
    """A one-argument factory ``seed -> Env`` for a registered env (what :func:`check_env` takes)."""

    def make(seed: int | None = None) -> Env:
        return make_env(env_class, extras, seed)

    make.__name__ = f"make_{env_class.replace('/', '_')}"
    return make
