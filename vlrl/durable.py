"""Files that survive a kill: written aside, flushed to disk, then renamed into place (no torch here).

Checkpoints (:mod:`vlrl.train.checkpoint`), a run's ``summary.json`` (:mod:`vlrl.train.metrics`) and its
``config.toml`` (the training loop, the maze curriculum) share these, so a reader never sees half a file and a killed
process leaves the old one or the new.
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_PREFIX = ".tmp-"
"""What a file or directory is called while it is written beside its final place."""


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it to disk before returning."""
    with Path(path).open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory's entries (a rename is durable once its directory is), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a reader (or a kill) never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    write_synced(tmp, text.encode("utf-8"))
    os.replace(tmp, path)
