"""The future table: every queued request's outcome, kept whether or not its client is still connected.

A request that queues work answers at once with ``{"request_id": ...}``; the work runs on an executor
that knows nothing of HTTP, so a client that disconnects (or a proxy that drops the poll) loses nothing:
``retrieve_future`` with the same id finds the result later. Training work runs on **one** thread, in
arrival order (the SDK submits a training client's requests in ``seq_id`` order and waits its turn), so
a model is never touched by two requests at once; sampling runs on a pool (the engine batches it).

Idempotency: a request carrying a key (``(model_id, seq_id, route)`` for training requests) that is
submitted again — an SDK retry after a lost response — gets the first submission's id back and is not
run twice. Finished entries are dropped ``ttl_s`` after they finish, and the oldest beyond
``max_entries``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal

from vlrl.errors import VlrlError

Category = Literal["user", "server"]


@dataclass(frozen=True)
class Proto:
    """A result the SDK reads as protobuf (``SampleResponse``, ``ForwardBackwardOutput``)."""

    data: bytes


@dataclass(frozen=True)
class Json:
    data: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    error: str
    category: Category


Outcome = Proto | Json | Failed


class UnknownIdError(KeyError):
    """A request id (or another id) that the server does not know, or no longer keeps (HTTP 404)."""


class _Entry:
    def __init__(self, request_id: str, extra: dict[str, Any]):
        self.request_id, self.extra = request_id, extra
        self.done = threading.Event()
        self.outcome: Outcome | None = None
        self.finished_at = 0.0


class FutureTable:
    """``submit(work) -> request id``; ``wait(id, timeout) -> outcome or None`` (still running)."""

    def __init__(self, *, max_entries: int = 10_000, ttl_s: float = 3600.0):
        self.max_entries, self.ttl_s = max_entries, ttl_s
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._by_key: dict[Hashable, str] = {}
        self._lock = threading.Lock()

    def submit(
        self,
        executor: Executor,
        work: Callable[[], Outcome],
        *,
        key: Hashable | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Queue ``work`` on ``executor``; returns the untyped future ``{"request_id", **extra}``."""
        with self._lock:
            self._expire()
            if key is not None and key in self._by_key and self._by_key[key] in self._entries:
                entry = self._entries[self._by_key[key]]
                return {"request_id": entry.request_id, **entry.extra}
            entry = _Entry(uuid.uuid4().hex, dict(extra or {}))
            self._entries[entry.request_id] = entry
            if key is not None:
                self._by_key[key] = entry.request_id
        executor.submit(self._run, entry, work)
        return {"request_id": entry.request_id, **entry.extra}

    def _run(self, entry: _Entry, work: Callable[[], Outcome]) -> None:
        try:
            outcome = work()
        except VlrlError as exc:  # vlrl's own refusals (bad input, limits) are the caller's to fix
            outcome = Failed(str(exc), "user")
        except Exception as exc:  # noqa: BLE001 — any other failure is reported, never lost with the thread
            outcome = Failed(f"{type(exc).__name__}: {exc}", "server")
        entry.outcome = outcome
        entry.finished_at = time.monotonic()
        entry.done.set()

    def wait(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome, waiting up to ``timeout`` s for it (None: still running); UnknownIdError if unknown."""
        with self._lock:
            entry = self._get(request_id)
        entry.done.wait(timeout)
        return entry.outcome

    def peek(self, request_id: str) -> Outcome | None:
        """The outcome if finished, else None; UnknownIdError if unknown (or expired)."""
        with self._lock:
            return self._get(request_id).outcome

    def _get(self, request_id: str) -> _Entry:
        try:
            return self._entries[request_id]
        except KeyError:
            raise UnknownIdError(f"unknown request_id {request_id!r} (never submitted, or expired)") from None

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self) -> None:
        now = time.monotonic()
        stale = [rid for rid, e in self._entries.items() if e.done.is_set() and now - e.finished_at > self.ttl_s]
        excess = len(self._entries) - len(stale) - self.max_entries
        if excess > 0:
            stale += [rid for rid, e in self._entries.items() if e.done.is_set() and rid not in stale][:excess]
        for rid in stale:
            del self._entries[rid]
        if stale:
            live = set(self._entries)
            self._by_key = {k: v for k, v in self._by_key.items() if v in live}
