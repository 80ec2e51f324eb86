"""The maze curriculum's SFT batches: expert episodes kept in a pool and cycled over (:func:`sft_phase`'s data).

The expert's episodes do not depend on the model, and building a batch of them (rendering every turn's
conversation, on the CPU) costs far more than an update of the curriculum's small models: on the H200 a batch of 64
``easy`` episodes took ~16 s against ~1.3 s for an update on it (benchmarks/results/maze_curriculum_h100/chain_v5_q3).

- ``fill="first"`` (the default): the first ``size`` steps each build a batch and keep it, then steps cycle over
  the kept ones — epochs over ``size * rows`` fixed episodes, with the GPU idle while each batch is built.
- ``fill="background"``: one thread builds batch after batch while the steps train on what is kept; a finished
  batch joins the pool, replacing the oldest once it holds ``size``. A step waits only while the pool is empty, and
  over a phase the policy sees as many distinct mazes as the CPU renders in it (the pool a sliding window of the
  freshest). Which batch a step trains on then depends on timing. Single-process runs only: a sharded run's
  rollouts broadcast across ranks, which a thread of one rank cannot do. On the H200, 180 s of SFT at easy from
  random init took 124 steps so against 52 filled first, a step 14 % slower beside the builder (the GIL)
  (benchmarks/results/maze_curriculum_h100/sft_fill_h200).

Rows are drawn on the caller's thread (the training stream's position is the run's state), the episodes rendered on
the builder's (the renderer is thread-safe); a batch is built only while its last build time still fits before the
deadline, so the phase never waits long on one at its end.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

PoolFill = Literal["first", "background"]


class SftPool:
    """Batches for SFT steps, per kind (first turns only / whole episodes): ``batch(step, first)``."""

    def __init__(self, run: Any, size: int, *, masked: bool, fill: PoolFill = "first", deadline: float = float("inf")):
        from vlrl.envs.maze_curriculum import first_turn_row

        if fill == "background" and run.dist.sharded:
            raise ValueError("sft pool fill 'background' needs a single-process run (rollouts broadcast across ranks)")
        self.run, self.size, self.masked, self.fill, self.deadline = run, max(1, size), masked, fill, deadline
        self._cut = first_turn_row
        self.kept: dict[bool, list] = {True: [], False: []}
        self.built = {True: 0, False: 0}  # batches built per kind (the pool keeps the last ``size``)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vlrl-sft-pool") if fill == "background" else None
        self._pending: tuple[bool, Future] | None = None
        self._build_s = 0.0  # the last batch's build time

    def batch(self, step: int, first: bool):
        """The batch SFT step ``step`` trains on (``first``: rows cut to their first turn)."""
        kept = self.kept[first]
        if self._pool is None:
            if len(kept) < self.size:
                self._keep(first, self._build(self._rows(first), step, first))
                return kept[-1]
            return kept[step % len(kept)]
        self._collect(first, wait=not kept)
        return kept[step % len(kept)]

    def episodes(self) -> int:
        """Episodes built so far (both kinds)."""
        return (self.built[True] + self.built[False]) * self.run.cfg.sft.rows_per_step

    def close(self) -> None:
        """Wait for a batch being built (the renderer is the next phase's too), then stop the builder."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pending = None, None

    def _rows(self, first: bool) -> list:
        rows = self.run.next_rows(self.run.cfg.sft.rows_per_step)
        return [self._cut(r) for r in rows] if first else rows

    def _build(self, rows: list, seed: int, first: bool):
        from vlrl.envs.maze_sft_data import expert_episodes
        from vlrl.train.loop import require_batch

        t = time.time()
        trajs = expert_episodes(self.run, rows, seed, masked=self.masked and not first)
        batch = require_batch(self.run, trajs, f"SFT batch {self.built[first] + 1}")
        self._build_s = time.time() - t
        return batch

    def _keep(self, first: bool, batch) -> None:
        kept = self.kept[first]
        kept.append(batch)
        if len(kept) > self.size:
            kept.pop(0)
        self.built[first] += 1

    def _collect(self, first: bool, wait: bool) -> None:
        """Keep a finished batch, waiting for one when ``wait``; then start the next of kind ``first``."""
        assert self._pool is not None
        while True:
            if self._pending is not None and (wait or self._pending[1].done()):
                kind, future = self._pending
                self._pending = None
                self._keep(kind, future.result())
            if self._pending is None and time.time() + self._build_s < self.deadline:
                seed = self.built[first] + self.built[not first]
                self._pending = (first, self._pool.submit(self._build, self._rows(first), seed, first))
            if not wait or self.kept[first]:
                return
            if self._pending is None:  # too late for another batch and none of this kind: build it here
                self._keep(first, self._build(self._rows(first), 0, first))
                return
