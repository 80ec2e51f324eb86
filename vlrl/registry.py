"""The one registry mechanism: a named dict of things of one kind (functions, env factories, experts).

Each family owns one module-level :class:`Registry`: algorithm variants (advantages, policy losses,
aggregations, KL estimators, correction levels and modes, in ``vlrl.algos``), envs and SFT experts
(``vlrl.envs.registry``). ``register("name")`` (a decorator) and ``add(name, obj)`` refuse a name
that is already taken unless told to replace it; ``get(name)`` names the valid choices when asked
for an unknown one. Callers select by looking up, never through ``if name == ...`` chains.
Installed packages add to a family through an entry-point group (:meth:`Registry.add_entry_points`;
the envs' is ``vlrl.envs``). Standard library only: ``vlrl.algos`` and ``vlrl.envs`` import it and stay light.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A name that nothing of this family is registered under."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateNameError(ValueError):
    """A second registration under a name that is already taken."""


def _describe(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or repr(obj)


class Registry(Generic[T]):
    """A named ``dict[str, T]`` with refusing registration and a helpful ``get``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T, *, replace: bool = False) -> T:
        """File ``obj`` under ``name``; raise :class:`DuplicateNameError` if taken (unless ``replace``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items and not replace:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered (by {_describe(self._items[name])})")
        self._items[name] = obj
        return obj

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def deco(obj: T) -> T:
            return self.add(name, obj, replace=replace)

        return deco

    def add_entry_points(self, group: str, adapt: Callable[[Any], T | None]) -> list[str]:
        """File each installed entry point of ``group`` as ``adapt(entry_point)`` under its name (``None``: the
        adapter handled it itself, e.g. imported a module that registers on import); returns the names filed.

        An entry point never replaces a name already taken (a package cannot shadow a built-in): that is a
        :class:`DuplicateNameError` naming the distribution.
        """
        from importlib.metadata import entry_points

        filed = []
        for ep in entry_points(group=group):
            obj = adapt(ep)
            if obj is None:
                continue
            dist = getattr(getattr(ep, "dist", None), "name", "?")
            if ep.name in self._items:
                raise DuplicateNameError(
                    f"{self.kind} {ep.name!r} from entry point {group}:{ep.name} of {dist} is already registered "
                    f"(by {_describe(self._items[ep.name])})"
                )
            self.add(ep.name, obj)
            filed.append(ep.name)
        return filed

    def remove(self, name: str) -> None:
        """Forget ``name`` (no error if absent): tests that register on the fly clean up with this."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        """The thing filed under ``name``; the error lists every valid name."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            valid = ", ".join(sorted(self._items)) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._items))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
