"""The one thread that drives an in-process vLLM ``LLMEngine`` (``vlrl.vllm.inprocess``).

vLLM's ``LLMEngine`` is not thread-safe, and a rollout asks for generations from many coroutines and threads at
once: every use of the engine goes through this thread. Requests join the running batch as they come (continuous
batching, as the server's engine loop does); a call made ``when_idle`` (a weight reload, a cache reset) waits for
the requests before it to finish, and holds later ones behind it, as a server's ``/pause?mode=wait``.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from vlrl.vllm.config import VllmServerError


class Driver:
    """The one thread that uses the ``LLMEngine``: jobs in, one step at a time, futures out."""

    def __init__(self, engine):
        self.engine = engine
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: dict[str, Future] = {}
        self.ids = itertools.count()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="vlrl-vllm-driver", daemon=True)
        self.thread.start()

    def submit(self, engine_input: Any, params: Any) -> Future:
        fut: Future = Future()
        self.inbox.put(("add", engine_input, params, fut))
        return fut

    def call(self, fn: Callable[[], Any], *, when_idle: bool = False) -> Any:
        """``fn()`` on the driver thread (``when_idle``: after every request before it has finished); its result."""
        fut: Future = Future()
        self.inbox.put(("idle" if when_idle else "call", fn, None, fut))
        return fut.result()

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=60)

    def _loop(self) -> None:
        held: list = []  # jobs behind a when-idle call, in order
        while True:
            busy = bool(self.pending)
            try:
                job = self.inbox.get(block=not busy and not held)
            except queue.Empty:
                job = False
            while job is not False:
                if job is None:
                    self._fail(VllmServerError("the in-process vLLM engine was closed"))
                    return
                held.append(job)
                try:
                    job = self.inbox.get_nowait()
                except queue.Empty:
                    job = False
            while held and not (held[0][0] == "idle" and self.pending):
                self._run(held.pop(0))
            if self.pending:
                self._step()

    def _run(self, job: tuple) -> None:
        kind, a, b, fut = job
        try:
            if self.error is not None:
                raise VllmServerError(f"the in-process vLLM engine failed earlier: {self.error!r}")
            if kind == "add":
                rid = str(next(self.ids))
                self.engine.add_request(rid, a, b)
                self.pending[rid] = fut
            else:
                fut.set_result(a())
        except BaseException as exc:  # noqa: BLE001 — the caller's future carries it
            fut.set_exception(exc)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except BaseException as exc:  # noqa: BLE001 — every waiting caller gets it
            self.error = exc
            self._fail(exc)
            return
        for out in outputs:
            if out.finished and out.request_id in self.pending:
                self.pending.pop(out.request_id).set_result(out)

    def _fail(self, exc: BaseException) -> None:
        for fut in self.pending.values():
            fut.set_exception(exc)
        self.pending.clear()
