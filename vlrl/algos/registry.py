"""The one registry mechanism for algorithm variants: a named dict of functions.

Each family (advantages, policy losses, aggregations, KL estimators, correction levels and
modes) owns one module-level :class:`Registry`. Its ``register("name")`` decorator refuses a
name that is already taken; ``get(name)`` names the valid choices when asked for an unknown
one. Callers select a variant by looking it up, never through ``if name == ...`` chains.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class UnknownNameError(KeyError):
    """A name that no function of this family is registered under."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateNameError(ValueError):
    """A second registration under a name that is already taken."""


class Registry(Generic[F]):
    """A named ``dict[str, function]`` with a refusing ``register`` and a helpful ``get``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: file the function under ``name``; raise if the name is taken."""

        def deco(fn: F) -> F:
            if name in self._fns:
                raise DuplicateNameError(
                    f"{self.kind} {name!r} is already registered (by {self._fns[name].__qualname__})"
                )
            self._fns[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        """The function filed under ``name``; the error lists every valid name."""
        try:
            return self._fns[name]
        except KeyError:
            valid = ", ".join(sorted(self._fns)) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._fns))

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._fns)
