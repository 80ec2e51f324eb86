"""The env and SFT-expert registries (:class:`vlrl.registry.Registry`).

- ``ENVS``: ``env_class`` name -> factory ``(extras, seed) -> Env``;
- ``EXPERTS``: expert name -> rollout script ``(env, row) -> Iterator[str]`` (the replies of an expert
  policy, read from the env's own state as the episode goes), defined beside its env.

Built-ins (maze2d/*, color_square, geometry, gym/*, and their experts) register themselves the first
time a registry is consulted, so importing this module stays cheap. Users register their own with
the same calls::

    register_env("my_env", lambda extras, seed: MyEnv(seed=seed, **extras))
    register_expert("my_env", my_expert)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from vlrl.envs.contract import Env, EnvError
from vlrl.registry import DuplicateNameError, Registry, UnknownNameError

EnvFactory = Callable[[Mapping[str, Any], "int | None"], Env]
Expert = Callable[[Any, Mapping[str, Any]], Iterator[str]]

ENVS: Registry[EnvFactory] = Registry("env_class")
EXPERTS: Registry[Expert] = Registry("expert")
_BUILTINS_LOADED = False


def _ensure_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from vlrl.envs import builtin  # noqa: F401  (registers on import)


def register_env(name: str, factory: EnvFactory, *, replace: bool = False) -> None:
    """Register ``factory(extras, seed) -> Env`` under ``name``; a duplicate raises unless ``replace``."""
    if not callable(factory):
        raise EnvError(f"factory for {name!r} is not callable")
    try:
        ENVS.add(name, factory, replace=replace)
    except DuplicateNameError:
        raise EnvError(f"env {name!r} is already registered; pass replace=True to override it") from None
    except ValueError as exc:
        raise EnvError(f"env name must be a non-empty string, got {name!r}") from exc


def unregister_env(name: str) -> None:
    """Remove a registration (tests that register envs on the fly clean up with this)."""
    ENVS.remove(name)


def registered_envs() -> list[str]:
    """Sorted names of every registered env, built-ins included."""
    _ensure_builtins()
    return list(ENVS.names())


def make_env(env_class: str, extras: Mapping[str, Any] | None = None, seed: int | None = None) -> Env:
    """Build an env from its registered name, row extras and seed (``None`` = fresh entropy).

    ``gym/<id>`` names that were never registered are built by the gymnasium adapter from
    ``extras`` (which must then carry ``keywords``; see :mod:`vlrl.envs.gym_adapter`).
    """
    _ensure_builtins()
    extras = dict(extras or {})
    if isinstance(env_class, str) and env_class.startswith("gym/") and env_class not in ENVS:
        from vlrl.envs.gym_adapter import make_gym_env_from_extras

        return make_gym_env_from_extras(env_class[len("gym/") :], extras, seed)
    try:
        factory = ENVS.get(env_class)
    except UnknownNameError as exc:
        raise EnvError(f"unknown env_class {env_class!r}; registered: {', '.join(ENVS.names())}") from exc
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


def register_expert(name: str, expert: Expert, *, replace: bool = False) -> None:
    """Register an SFT expert script ``(env, row) -> replies`` under ``name`` (usually its env's name)."""
    if not callable(expert):
        raise EnvError(f"expert {name!r} is not callable")
    try:
        EXPERTS.add(name, expert, replace=replace)
    except DuplicateNameError:
        raise EnvError(f"expert {name!r} is already registered; pass replace=True to override it") from None


def expert_for(name: str) -> Expert:
    """An expert by name (``maze2d`` serves every maze level); an unknown name lists the registered ones."""
    _ensure_builtins()
    return EXPERTS.get(name)


def registered_experts() -> list[str]:
    _ensure_builtins()
    return list(EXPERTS.names())
