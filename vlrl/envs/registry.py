"""The env and SFT-expert registries (:class:`vlrl.registry.Registry`).

- ``ENVS``: ``env_class`` name -> factory ``(extras, seed) -> Env``;
- ``EXPERTS``: expert name -> rollout script ``(env, row) -> Iterator[str]`` (the replies of an expert
  policy, read from the env's own state as the episode goes), defined beside its env.

Built-ins (maze2d/*, color_square, geometry, gym/*, and their experts) register themselves the first
time a registry is consulted, so importing this module stays cheap. Users register their own with
the same calls::

    register_env("my_env", lambda extras, seed: MyEnv(seed=seed, **extras))
    register_expert("my_env", my_expert)

Envs from anywhere (the same ``module:factory`` rule as ``vlrl check-env``): ``data.env=pkg.mod:make_env`` in a
config, ``--env pkg.mod:make_env`` on ``vlrl rollout`` / ``vlrl dataset``, ``sft.expert=pkg.mod:expert``. The
config or command line imports the module (:func:`resolve_env`, :func:`resolve_expert`) and files the factory
under that very string, so rows carry it as their ``env_class``; a dataset row itself never imports anything: an
``env_class`` with a ``module:`` that nothing registered is refused (:func:`make_env`). Such a factory is
``factory(seed, **extras) -> Env``; extras are checked against its signature before anything runs.

Installed packages register theirs through the entry-point group ``vlrl.envs``::

    [project.entry-points."vlrl.envs"]
    quadrant = "quad_pkg.env:make_env"     # an env named "quadrant": factory(seed, **extras) -> Env
    quad_pkg = "quad_pkg.register"         # a module: imported, it calls register_env / register_expert
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from vlrl.envs.contract import Env, EnvError
from vlrl.registry import DuplicateNameError, Registry, UnknownNameError

EnvFactory = Callable[[Mapping[str, Any], "int | None"], Env]
Expert = Callable[[Any, Mapping[str, Any]], Iterator[str]]

ENVS: Registry[EnvFactory] = Registry("env_class")
EXPERTS: Registry[Expert] = Registry("expert")
ENTRY_POINTS = "vlrl.envs"
_BUILTINS_LOADED = False


def _ensure_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        from vlrl.envs import builtin  # noqa: F401  (registers on import)

        ENVS.add_entry_points(ENTRY_POINTS, _from_entry_point)


def _from_entry_point(ep: Any) -> EnvFactory | None:
    """``name = "module:factory"``: an env under ``name``, imported when first made or checked;
    ``name = "module"``: imported now, for the registrations it makes."""

    def load() -> Any:
        try:
            return ep.load()
        except (ImportError, AttributeError) as exc:  # a broken installed package: say which, in one line
            dist = getattr(getattr(ep, "dist", None), "name", "?")
            raise EnvError(f"entry point {ENTRY_POINTS}:{ep.name} = {ep.value!r} of {dist}: {exc}") from None

    if not ep.attr:
        load()
        return None
    return KeywordFactory(ep.value, load)


def is_target(name: object) -> bool:
    """``module:attr`` (what only a config or command line may import), as opposed to a registered name."""
    return isinstance(name, str) and ":" in name and not name.startswith("gym/")


def load_target(target: str, what: str) -> Callable[..., Any]:
    """The callable ``module:attr`` names (``attr`` may be dotted), imported as ``vlrl check-env`` does: the
    current directory first on ``sys.path``. ``what`` (``data.env``) names the setting in errors."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise EnvError(f"{what} = {target!r}: expected module:factory")
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, ".")  # so `data.env=my_envs:make` finds ./my_envs.py
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvError(f"{what} = {target!r}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise EnvError(f"{what} = {target!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvError(f"{what} = {target!r}: {attr} is a {type(obj).__name__}, not callable")
    return obj


def check_extras(fn: Callable[..., Any], extras: Mapping[str, Any], where: str) -> None:
    """Refuse extras that ``fn(seed, **extras)`` cannot take, naming them and the factory's parameters."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check against
    try:
        sig.bind(0, **extras)
    except TypeError as exc:
        params = list(sig.parameters)[1:]
        unknown = sorted(set(extras) - set(sig.parameters))
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            raise EnvError(
                f"extras {unknown} are not parameters of {where}(seed, ...), which takes "
                f"{', '.join(params) or 'no extras'}"
            ) from None
        raise EnvError(f"{where}: cannot call {where}(seed, **extras) with extras {sorted(extras)}: {exc}") from None


class KeywordFactory:
    """A user's ``factory(seed, **extras) -> Env`` (``module:factory``, or an entry point) as the registry's
    ``(extras, seed) -> Env``; ``load`` imports it on first use."""

    def __init__(self, target: str, load: Callable[[], Callable[..., Any]]) -> None:
        self.target = target
        self.__qualname__ = target
        self._load = load
        self._fn: Callable[..., Any] | None = None

    @property
    def fn(self) -> Callable[..., Any]:
        if self._fn is None:
            fn = self._load()
            if not callable(fn):
                raise EnvError(f"{self.target}: a {type(fn).__name__}, not a callable factory")
            self._fn = fn
        return self._fn

    def check(self, extras: Mapping[str, Any]) -> None:
        check_extras(self.fn, extras, self.target)

    def __call__(self, extras: Mapping[str, Any], seed: int | None) -> Env:
        self.check(extras)
        return self.fn(seed, **extras)


def resolve_env(name: str, what: str = "data.env") -> str:
    """A config's or command line's env: a registered name as is; ``module:factory`` imported (here, never
    from a row) and registered under that string. Returns the name rows carry."""
    _ensure_builtins()
    if is_target(name) and name not in ENVS:
        fn = load_target(name, what)
        ENVS.add(name, KeywordFactory(name, lambda: fn))
    return name


def check_env_extras(name: str, extras: Mapping[str, Any]) -> None:
    """At config time: extras that a ``factory(seed, **extras)`` env (module:factory, entry point) cannot take
    are refused now, not when the first env is made. Registered ``(extras, seed)`` factories check their own."""
    _ensure_builtins()
    factory = ENVS.get(name) if name in ENVS else None
    if isinstance(factory, KeywordFactory):
        factory.check(extras)


def resolve_expert(name: str, what: str = "sft.expert") -> str:
    """Like :func:`resolve_env` for an SFT expert ``module:fn`` (``fn(env, row) -> Iterator[str]``)."""
    _ensure_builtins()
    if is_target(name) and name not in EXPERTS:
        EXPERTS.add(name, load_target(name, what))
    return name


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
    if is_target(env_class) and env_class not in ENVS:
        raise EnvError(
            f"env_class {env_class!r} names a module, which a dataset row may not import; give it as "
            f"data.env={env_class} (or --env {env_class}) so the config imports it"
        )
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

    make.__name__ = f"make_{env_class.replace('/', '_').replace(':', '_').replace('.', '_')}"
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
    """An expert by name (``maze2d`` serves every maze level); an unknown name lists the registered ones.
    ``module:fn`` must have been resolved by the config (:func:`resolve_expert`), as for envs."""
    _ensure_builtins()
    return EXPERTS.get(name)


def registered_experts() -> list[str]:
    _ensure_builtins()
    return list(EXPERTS.names())
