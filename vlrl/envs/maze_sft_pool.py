"""The maze curriculum's SFT batches: expert episodes kept in a pool and cycled over (:func:`sft_phase`'s data).

The expert's episodes do not depend on the model, and building a batch of them (rendering every turn's
conversation, on the CPU) costs far more than an update of the curriculum's small models: on the H200 a batch of 64
``easy`` episodes took ~16 s against ~1.3 s for an update on it (benchmarks/results/maze_curriculum_h100/chain_v5_q3).

- ``fill="first"`` (the default): the first ``size`` steps each build a batch and keep it, then steps cycle over
  the kept ones — epochs over ``size * rows`` fixed episodes, with the GPU idle while each batch is built.
- ``fill="background"``: one thread builds batch after batch while the steps train on what is kept; a finished
  batch joins the pool, replacing the oldest once it holds ``size``. A step waits only while the pool is empty, and
  over a phase the policy sees as many distinct mazes as the CPU renders in it (the pool a sliding window of the
  freshest). Which batch a step trains on then depends on timing. On the H200, 180 s of SFT at easy from random
  init took 124 steps so against 52 filled first, a step 14 % slower beside the builder (the GIL)
  (benchmarks/results/maze_curriculum_h100/sft_fill_h200).
- ``fill="processes"``: the same sliding window, filled by ``builders`` worker processes at once
  (:class:`vlrl.envs.maze_sft_farm.ExpertFarm`): no GIL shared with the steps, and as many batches at a time as
  there are workers.
- ``takeover=(N, M)``, N > 0: every N-th whole-episode step starts a batch of takeover episodes (the policy plays
  up to M turns, then the expert: :mod:`vlrl.envs.maze_sft_data`): after a weight sync the step rolls out the
  policy's turns on the run's engine, batched. Filled by processes, a worker renders the episodes and the first
  step after it finishes trains on the batch (a few steps later: the policy of a few steps ago); otherwise the step
  renders them itself and trains on them. Never kept: the policy changes every step. ``takeover_s`` adds up the
  seconds the steps spent on them.
- ``forks=(share, draw)``, share > 0: a whole-episode batch's rows are ``draw`` times as many candidates, and its
  builder picks ``share`` of the batch from those whose maze has a fork where heading for the goal turns from the
  right way (:func:`vlrl.envs.maze_sft_data.fork_rows`), the rest in the order drawn. On the GPU only a smoke run
  (docs/maze.md item 28): whether the builders keep pace with it is not yet measured.

- ``prefetch=True``: a thread fetches the next step's batch while this step trains (guessing it is of this step's
  kind) and on a GPU copies it from page-locked memory on its own stream, so neither the wait for a batch nor its
  copy (on an H100 0.24 s and 0.33 s of a 2.34 s easy step, docs/maze.md item 36) holds the step up. Not with
  takeover batches (their policy turns need the engine after a weight sync, on the training loop's thread).

The two filled while steps train need a single-process run: a sharded run's rollouts broadcast across ranks, which
a builder of one rank cannot do.

Rows are drawn on the caller's thread (the training stream's position is the run's state), the episodes rendered on
the builder's (the renderer is thread-safe); a batch is built only while its last build time still fits before the
deadline, so the phase never waits long on one at its end.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from vlrl.envs.maze2d import Start

PoolFill = Literal["first", "background", "processes"]
TAKEOVER_SEED = 20_000_003
"""Plus the step: the takeover episodes' rollout seed (their policy turns are greedy; the seed only names them)."""


class SftPool:
    """Batches for SFT steps, per kind (first turns only / whole episodes): ``batch(step, first)``."""

    def __init__(
        self,
        run: Any,
        size: int,
        *,
        masked: bool,
        fill: PoolFill = "first",
        deadline: float = float("inf"),
        builders: int = 0,
        first_start: Start = "corner",
        takeover: tuple[int, int] = (0, 0),
        forks: tuple[float, int] = (0.0, 1),
        prefetch: bool = False,
    ):
        from vlrl.envs.maze_sft_data import first_turn_row
        from vlrl.envs.maze_sft_farm import ExpertFarm, default_workers

        if (fill != "first" or prefetch) and run.dist.sharded:
            what = f"fill {fill!r}" if fill != "first" else "prefetch"
            raise ValueError(f"sft pool {what} needs a single-process run (rollouts broadcast across ranks)")
        if prefetch and takeover[0] > 0:
            raise ValueError("sft pool prefetch cannot fetch takeover batches (their policy turns need this thread)")
        self.run, self.size, self.masked, self.fill, self.deadline = run, max(1, size), masked, fill, deadline
        self._cut = functools.partial(first_turn_row, start=first_start)
        self.kept: dict[bool, list] = {True: [], False: []}
        self.built = {True: 0, False: 0}  # batches built per kind (the pool keeps the last ``size``)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="vlrl-sft-pool") if fill == "background" else None
        self._farm = ExpertFarm(run, builders or default_workers()) if fill == "processes" else None
        self._inflight: list[tuple[bool, float, Future]] = []  # (kind, submitted at, future), oldest first
        self._credit = self.parallel  # batches that may start: one more per step, at most a builder each
        self._build_s = 0.0  # the last batch's build time
        self.takeover, self.takeovers = takeover, 0  # (every N-th step, up to M policy turns), batches trained on
        self.takeover_s = 0.0
        self.wait_s = self.copy_s = 0.0  # the last batch's wait and copy (:meth:`batch`)
        self._takeover_jobs: list[Future] = []  # takeover batches the farm is building, oldest first
        self.forks = forks  # (share, draw): a whole-episode batch picks share of its rows with an away fork
        self._fetcher = ThreadPoolExecutor(1, thread_name_prefix="vlrl-sft-prefetch") if prefetch else None
        self._ahead: tuple[tuple[int, bool], Future] | None = None  # ((step, first), the batch being fetched)
        self._stream: Any = None  # the CUDA stream the fetcher copies on

    @property
    def parallel(self) -> int:
        """Batches built at once (0: built by the step that needs one)."""
        return self._farm.workers if self._farm is not None else int(self._thread is not None)

    def batch(self, step: int, first: bool, device: Any = None):
        """The batch SFT step ``step`` trains on (``first``: rows cut to their first turn), moved to ``device`` if one
        is given. ``wait_s`` and ``copy_s`` then say how long the call waited for it and copied it: why a step
        took longer than its update (a lease's easy step 2.12 s, an update of kept batches alone 1.27 s; docs/maze.md
        Next item 4)."""
        t = time.time()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == (step, first):
            batch, copied = ahead[1].result()  # fetched while the last step trained: wait_s is what it did not hide
            self.wait_s, t = time.time() - t, time.time()
            if copied is not None:  # the copy's stream: this one's work on the batch waits for it
                import torch

                stream = torch.cuda.current_stream(batch.input_ids.device)
                stream.wait_event(copied)
                batch.record_stream(stream)
        else:
            if ahead is not None:
                ahead[1].result()  # a batch of the other kind: kept in the pool, this step fetches its own
            batch = self._next(step, first)
            self.wait_s, t = time.time() - t, time.time()
            if device is not None:
                batch = batch.to(device)  # from pageable host memory (the farm's mapped spool): copied at return
        self.copy_s = time.time() - t
        if self._fetcher is not None:
            self._ahead = ((step + 1, first), self._fetcher.submit(self._fetch, step + 1, first, device))
        return batch

    def _fetch(self, step: int, first: bool, device: Any):
        """(batch, event): step ``step``'s batch, on ``device`` if one is given; on a GPU copied from page-locked
        memory on the fetcher's stream, ``event`` marking the copy's end (else None)."""
        import torch

        batch = self._next(step, first)
        if device is None or torch.device(device).type != "cuda":
            return (batch if device is None else batch.to(device)), None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        with torch.cuda.stream(self._stream):
            moved = batch.pin_memory().to(device, non_blocking=True)
            return moved, self._stream.record_event()

    def _next(self, step: int, first: bool):
        every, turns = self.takeover
        if every > 0 and not first:
            if (step + 1) % every == 0 and (self._farm is None or time.time() + self._build_s < self.deadline):
                built = self._takeover(step, turns)
                if built is not None:
                    return built
            if self._takeover_jobs and self._takeover_jobs[0].done():
                self.takeovers += 1
                return self._farm.load(self._takeover_jobs.pop(0))  # type: ignore[union-attr]
        kept = self.kept[first]
        if not self.parallel:
            if len(kept) < self.size:
                self._keep(first, self._build(self._rows(first), step, first))
                return kept[-1]
            return kept[step % len(kept)]
        self._credit = min(self.parallel, self._credit + 1)
        self._collect(first, wait=not kept)
        return kept[step % len(kept)]

    def episodes(self) -> int:
        """Episodes built so far (both kinds)."""
        return (self.built[True] + self.built[False]) * self.run.cfg.sft.rows_per_step

    def close(self) -> None:
        """Wait for the batches being built (the renderer is the next phase's too), then stop the builders."""
        if self._fetcher is not None:
            self._fetcher.shutdown(wait=True)  # the fetch under way uses the builders below
            self._fetcher, self._ahead = None, None
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self._thread = None
        if self._farm is not None:
            self._farm.close()
            self._farm = None
        self._inflight, self._takeover_jobs = [], []

    def _rows(self, first: bool) -> list:
        """An expert batch's rows; with ``forks``, ``draw`` candidates per row of a whole-episode batch, which its
        builder picks from (:func:`~vlrl.envs.maze_sft_data.fork_rows`, ~1.3 ms a candidate at easy: a farm worker's
        work, off the training loop, when the pool fills by processes)."""
        n = self.run.cfg.sft.rows_per_step
        rows = self.run.next_rows(n * self.forks[1] if self._picks(first) else n)
        return [self._cut(r) for r in rows] if first else rows

    def _picks(self, first: bool) -> tuple[int, float] | None:
        """``expert_episodes``' ``pick`` (n, share) for a batch of kind ``first`` (None: its rows as drawn)."""
        share = self.forks[0]
        return (self.run.cfg.sft.rows_per_step, share) if share > 0 and not first else None

    def _what(self, first: bool) -> str:
        """The error label of the next batch of kind ``first`` (counting those being built)."""
        return f"SFT batch {self.built[first] + sum(kind == first for kind, _, _ in self._inflight) + 1}"

    def _build(self, rows: list, seed: int, first: bool):
        from vlrl.envs.maze_sft_data import expert_episodes
        from vlrl.train.loop import require_batch

        t = time.time()
        trajs = expert_episodes(self.run, rows, seed, masked=self.masked and not first, pick=self._picks(first))
        batch = require_batch(self.run, trajs, self._what(first))
        self._build_s = time.time() - t
        return batch

    def _takeover(self, step: int, turns: int):
        """A batch of takeover episodes of fresh rows: the policy's turns here on the engine (after a weight sync, so
        it plays the policy as it is now), the episodes rendered by a worker (queued behind the expert batches; None
        here, a later step trains on it) or, without the farm, here (the batch)."""
        from vlrl.envs.maze_sft_data import expert_episodes, policy_prefixes
        from vlrl.train.loop import require_batch

        t = time.time()
        self.run.sync_weights()
        rows, seed = self.run.next_rows(self.run.cfg.sft.rows_per_step), TAKEOVER_SEED + step
        prefixes = policy_prefixes(self.run, rows, seed, turns=turns)
        what, batch = f"takeover batch {self.takeovers + len(self._takeover_jobs) + 1}", None
        if self._farm is not None:
            self._takeover_jobs.append(self._farm.submit(rows, seed, True, what, prefixes))
        else:
            trajs = expert_episodes(self.run, rows, seed, masked=True, prefixes=prefixes)
            batch, self.takeovers = require_batch(self.run, trajs, what), self.takeovers + 1
        self.takeover_s += time.time() - t
        return batch

    def _keep(self, first: bool, batch) -> None:
        kept = self.kept[first]
        kept.append(batch)
        if len(kept) > self.size:
            kept.pop(0)
        self.built[first] += 1

    def _seed(self) -> int:
        """The next batch's rollout seed: batches built or being built so far."""
        return self.built[True] + self.built[False] + len(self._inflight)

    def _submit(self, first: bool) -> None:
        seed, rows = self._seed(), self._rows(first)
        if self._farm is not None:
            future = self._farm.submit(
                rows, seed, self.masked and not first, self._what(first), pick=self._picks(first)
            )
        else:
            assert self._thread is not None
            future = self._thread.submit(self._build, rows, seed, first)
        self._inflight.append((first, time.time(), future))

    def _harvest(self) -> None:
        """Keep every finished batch (in the order submitted)."""
        for item in list(self._inflight):
            kind, since, future = item
            if future.done():
                self._inflight.remove(item)
                batch = self._farm.load(future) if self._farm is not None else future.result()
                if self._farm is not None:
                    self._build_s = time.time() - since
                self._keep(kind, batch)

    def _collect(self, first: bool, wait: bool) -> None:
        """Keep the finished batches, waiting for one of kind ``first`` when ``wait``; then start new ones while
        builders are free, the steps have used what was built (``_credit``) and a batch still fits before the
        deadline. Why the credit: unthrottled, 14 workers built 94k 5x5 episodes in 90 s on the H200, and the
        parent's loads of batches no step used slowed its steps."""
        self._harvest()
        while True:
            mine = any(kind == first for kind, _, _ in self._inflight)
            if wait and not self.kept[first] and not mine:
                self._credit = max(self._credit, 1)  # a step is waiting on a batch of this kind: start one
            while (
                self._credit > 0 and len(self._inflight) < self.parallel and time.time() + self._build_s < self.deadline
            ):
                self._submit(first)
                self._credit -= 1
            if not wait or self.kept[first]:
                return
            if not self._inflight:  # too late for another batch and none coming: build it here
                self._keep(first, self._build(self._rows(first), self._seed(), first))
                return
            wait_for([f for _, _, f in self._inflight], return_when=FIRST_COMPLETED)
            self._harvest()
