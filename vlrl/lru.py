"""An LRU map bounded by bytes: the engine's vision and prefix caches and the decoded-image cache of
``vlrl.messages`` (a light module: no torch here)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruBytes(Generic[V]):
    """An LRU map bounded by the bytes of its values (each given at ``put``); ``max_bytes`` 0 keeps nothing."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: V, nbytes: int) -> list[Hashable]:
        """Store ``value`` (not at all if it alone exceeds the budget); returns the keys evicted for it."""
        if nbytes > self.max_bytes:
            return []
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._items[key] = (value, nbytes)
        self.bytes += nbytes
        evicted = []
        while self.bytes > self.max_bytes:
            k, (_, n) = self._items.popitem(last=False)
            self.bytes -= n
            evicted.append(k)
        return evicted

    def pop(self, key: Hashable) -> V | None:
        """Remove ``key``; returns its value (None when absent)."""
        hit = self._items.pop(key, None)
        if hit is None:
            return None
        self.bytes -= hit[1]
        return hit[0]

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
