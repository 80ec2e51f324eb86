"""Expert SFT batches built by worker processes, as many at once as the host has cores to spare.

Why: the maze expert's episodes cost CPU, not GPU — rendering each turn's conversation (ids and pixel patches). On
the H200 one core built a batch of 64 ``easy`` episodes in ~16 s against ~1.3 s to train on it; a thread beside the
training loop shares its GIL (~36 s a batch, and the steps 14 % slower). chain_v5's easy level trained 276 steps on
384 mazes and fit them (loss 0.021, 35 % of unseen ones solved). The GPU machine has 16 cores; N workers build N
batches at a time.

Measured on the H200 (benchmarks/results/maze_curriculum_h100/farm_h200): 10 workers kept a fresh batch for nearly
every step — 5x5 solved (100 % of 100) in 90 s; at easy 12,416 distinct mazes in 360 s, but the loss stayed at
0.14 and 1 % were solved, where pools of 4–8 cycled batches reached 16–35 %: more mazes did not make easy learn
faster in that budget. A step beside 10 workers took 1.53 s at easy against 1.34 s filled first.

Each worker holds its own renderer, built from the model's directory by the same ``EmbeddedRenderer.from_pretrained``
the run's engine uses (the same code, so the same ids and pixels), plays the expert's episodes through the rollout
path without an engine, collates them with the run's :class:`~vlrl.train.batch.CollateSpec` and hands the
:class:`~vlrl.train.batch.Batch` back through a spool file (``torch.save`` of tensors and plain values only, loaded
with ``weights_only=True``: a spool file never unpickles code; the parent maps it and unlinks it: no pickling of
~1.5 GB of pixels per batch through a pipe). The spool lives in ``/dev/shm`` when it has room, else in
the temp directory. Workers are spawned (not forked: the parent holds CUDA) and run torch on one thread each;
spawning re-imports the launching script, so a script that fills the pool this way needs the
``if __name__ == "__main__":`` guard (``benchmarks/maze_curriculum.py`` has it). A parent killed outright (SIGKILL, the
out-of-memory killer) runs no cleanup, so each worker watches for it and then exits, removing the spool.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

SPOOL_MIN_FREE = 16 << 30
"""``/dev/shm`` is used for the spool only with this much free (a batch of 64 hard episodes is ~3 GB)."""

_WORKER: dict[str, Any] = {}  # the worker process's renderer and collate spec (set by _start)
PARENT_POLL_S = 1.0
"""How often a worker checks that the process that started it is still its parent."""


WORKER_MEMORY = 12 << 30
"""Memory one worker may need: a batch's images three times over (cache, conversation rows, the collated batch)
and its spool file; on the H200 10 workers at easy peaked at 51 GiB used (farm_h200/c7b_mem.log), hard's batches
are ~2x easy's."""


def default_workers(meminfo: str = "/proc/meminfo") -> int:
    """All cores but two (the training loop's host thread and the GPU's feeding), no more than the available memory
    holds at :data:`WORKER_MEMORY` each, at least one."""
    workers = (os.cpu_count() or 1) - 2
    try:
        with open(meminfo) as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        workers = min(workers, (kib << 10) // WORKER_MEMORY)
    except (OSError, StopIteration, ValueError, IndexError):
        pass  # not Linux: the cores alone
    return max(1, workers)


def spool_root() -> str:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= SPOOL_MIN_FREE:
        return str(shm)
    return tempfile.gettempdir()


class ExpertFarm:
    """``workers`` processes building expert SFT batches for ``run``: ``submit(rows, seed, masked) -> Future``."""

    def __init__(self, run: Any, workers: int):
        import torch.multiprocessing as mp

        self.workers = max(1, workers)
        self._config = dataclasses.replace(
            run.rollout_config(0, repeats=1), max_context=run.engine.max_context, progress=False
        )
        self._spool = tempfile.mkdtemp(prefix="vlrl-sft-farm-", dir=spool_root())
        self._pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            self.workers,
            mp_context=mp.get_context("spawn"),
            initializer=_start,
            initargs=(str(run.model_dir), run.spec, self._spool),
        )
        self._n = 0

    def submit(
        self,
        rows: list,
        seed: int,
        masked: bool,
        what: str,
        prefixes: dict | None = None,
        pick: tuple[int, float] | None = None,
    ) -> Future:
        """A future of the :class:`~vlrl.train.batch.Batch` of ``rows``' expert episodes (``seed``: the rollout's;
        ``prefixes``: per row seed, turns replayed before the expert's; ``pick``: ``rows`` are candidates, as
        :func:`~vlrl.envs.maze_sft_data.expert_episodes` takes them)."""
        if self._pool is None:
            raise RuntimeError("the expert farm is closed")
        self._n += 1
        path = os.path.join(self._spool, f"batch-{self._n}.pt")
        return self._pool.submit(_build, rows, self._config, seed, masked, what, path, prefixes, pick)

    def load(self, future: Future):
        """The finished batch of ``future`` (memory-mapped from its spool file, which is removed)."""
        path = future.result()
        try:
            return load_spool(path)
        finally:
            os.unlink(path)

    def close(self) -> None:
        """Stop the workers (jobs not started are cancelled) and remove the spool."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        shutil.rmtree(self._spool, ignore_errors=True)


class _WorkerRun:
    """What :func:`~vlrl.envs.maze_sft_data.expert_episodes` and ``require_batch`` ask of a run, in a worker."""

    def __init__(self, config: Any):
        self.config = config

    def rollout(self, rows, *, seed: int, repeats: int, script) -> list:
        from vlrl.rollout.generator import RolloutGenerator

        config = dataclasses.replace(self.config, seed=seed, repeats=repeats)
        return RolloutGenerator(_WORKER["renderer"], None, config).run(rows, script=script)

    def collate(self, trajectories):
        from vlrl.train.batch import collate_trained

        return collate_trained(trajectories, _WORKER["spec"])


def _start(model_dir: str, spec: Any, spool: str) -> None:
    import torch

    threading.Thread(target=_exit_with_parent, args=(os.getppid(), spool), daemon=True, name="vlrl-farm-watch").start()
    torch.set_num_threads(1)  # one core per worker: N workers, N cores
    from vlrl.render.embedded import EmbeddedRenderer

    _WORKER["renderer"] = EmbeddedRenderer.from_pretrained(model_dir)
    _WORKER["spec"] = spec


def _exit_with_parent(parent: int, spool: str) -> None:
    """Exit once ``parent`` is gone (this process re-parented). A worker blocked on the pool's queues does not
    notice its parent's death: before this, a CPU run's worker lived on asleep with 2.2 GB for 22 minutes after the
    out-of-memory killer took the run."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    shutil.rmtree(spool, ignore_errors=True)
    os._exit(1)


def _build(
    rows: list,
    config: Any,
    seed: int,
    masked: bool,
    what: str,
    path: str,
    prefixes: dict | None,
    pick: tuple[int, float] | None = None,
) -> str:
    from vlrl.envs.maze_sft_data import expert_episodes
    from vlrl.train.loop import require_batch

    run = _WorkerRun(config)
    try:
        trajs = expert_episodes(run, rows, seed, masked=masked, prefixes=prefixes, pick=pick)
        batch = require_batch(run, trajs, what)
        save_spool(batch, path)
    finally:
        _release()
    return path


SPOOL_FORMAT = "vlrl-sft-batch/1"


def save_spool(batch: Any, path: str) -> None:
    """``batch`` (a :class:`~vlrl.train.batch.Batch`) as a dict of its fields: tensors, ``None``, str, float and
    the engine's top-k as a dict, which ``torch.load(weights_only=True)`` reads back without unpickling a class."""
    import torch

    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    top = fields["engine_topk"]
    fields["engine_topk"] = None if top is None else {f.name: getattr(top, f.name) for f in dataclasses.fields(top)}
    fields["uids"] = list(fields["uids"])
    fields["temperature"] = float(fields["temperature"])
    torch.save({"format": SPOOL_FORMAT, "batch": fields}, path)


def load_spool(path: str) -> Any:
    """The :class:`~vlrl.train.batch.Batch` :func:`save_spool` wrote (memory-mapped); anything but tensors and plain
    containers in the file is refused by ``weights_only=True`` before it can run."""
    import torch

    from vlrl.train.batch import Batch, EngineTopK

    doc = torch.load(path, mmap=True, weights_only=True)
    if not isinstance(doc, dict) or doc.get("format") != SPOOL_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{path}: spool format {got!r}, not {SPOOL_FORMAT!r}")
    fields = dict(doc["batch"])
    top = fields["engine_topk"]
    fields["engine_topk"] = None if top is None else EngineTopK(**top)
    fields["uids"] = tuple(fields["uids"])
    return Batch(**fields)


TRIM_ABOVE = 1 << 30
"""A worker trims the C heap only once its resident set is this far above where its first batch left it: a trim after
every batch kept it flat but cost 10-30 % of a batch's time (the freed pages fault back in)."""


def _release() -> None:
    """Let go of a built batch: the next batch's mazes are new, so a worker holds one batch's images at a time. The
    decoded-image cache goes too: its entries, made among each batch's large buffers and kept after them, grew a
    worker's resident set without end (7x7: 981 -> 2,628 MB over 90 batches, 1,058 MB without them); the heap is
    trimmed only past :data:`TRIM_ABOVE` (``benchmarks/farm_worker_memory.py``)."""
    from vlrl.messages import forget_decoded

    _WORKER["renderer"].forget()
    forget_decoded()
    rss = _resident_bytes()
    floor = _WORKER.setdefault("rss_floor", rss)
    if rss is not None and floor is not None and rss > floor + TRIM_ABOVE:
        _malloc_trim()


def _resident_bytes() -> int | None:
    """This process's resident set (Linux's ``/proc/self/statm``; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _malloc_trim() -> None:
    """glibc's ``malloc_trim(0)`` where there is one (not on macOS or musl: nothing to do there)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)
