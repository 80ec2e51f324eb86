"""A curriculum level's weights on disk: the level's final directory, and snapshots taken during a long SFT phase.

A device lease may end without warning (a machine stopped answering and took chain_v14's last 658 s with it), so a
process that trains for a whole lease leaves loadable directories behind as it goes, for a watcher to pack and bring
back (``benchmarks/device/lease.sh``). Every directory is written beside its final name and renamed into place: a
reader never sees one half written, and a level may continue from the directory it saves to.

torch is only touched through the run's own model: importing this module stays light.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

SUFFIX = ".new"
"""Directories being written end in it; readers skip them."""


def save_weights(run, dest: Path) -> Path:
    """A loadable model directory of the run's weights and the start's other files, built beside ``dest`` and swapped
    in: ``dest`` may be where the run started from (deleting it before the copy lost chain_v14 a call's SFT)."""
    new = dest.with_name(dest.name + SUFFIX)
    shutil.rmtree(new, ignore_errors=True)
    shutil.copytree(run.model_dir, new, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    run.model.save_pretrained(new)
    shutil.rmtree(dest, ignore_errors=True)
    return new.rename(dest)


class Snapshots:
    """Every ``every`` seconds of a phase, the run's weights as ``root/step_NNNNNN`` (its SFT step); the newest
    ``keep`` stay, so the one a watcher is packing outlives the next snapshot. ``every`` 0: none."""

    def __init__(self, run, root: Path, every: float, keep: int = 2):
        if every < 0 or keep < 1:
            raise ValueError(f"snapshots every {every} s, keep {keep}: expected every >= 0 and keep >= 1")
        self.run, self.root, self.every, self.keep = run, Path(root), every, keep
        self.last = time.time()
        self.taken: list[Path] = []

    def maybe(self, step: int) -> Path | None:
        """Save a snapshot if ``every`` seconds passed since the phase began or the last one; returns its path."""
        if not self.every or time.time() - self.last < self.every:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        path = save_weights(self.run, self.root / f"step_{step:06d}")
        self.last = time.time()
        self.taken.append(path)
        for old in self.taken[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self.taken = self.taken[-self.keep :]
        return path


def newest(root: Path) -> Path | None:
    """The most recently written complete model directory under ``root`` (a level's ``weights`` or a snapshot),
    by the time its weights were written; None if there is none."""
    written: dict[Path, float] = {}
    for f in Path(root).glob("**/*.safetensors"):
        if not f.parent.name.endswith(SUFFIX) and (f.parent / "config.json").is_file():
            written[f.parent] = max(written.get(f.parent, 0.0), f.stat().st_mtime)
    return max(written, key=written.__getitem__, default=None)
