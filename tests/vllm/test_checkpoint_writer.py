"""The checkpoint route's merged copy is scratch: it must leave nothing on disk behind it — not on close, not
when dropped, not at exit, and not after a killed process (the next writer sweeps it). Before this, every vLLM
engine that synced through the checkpoint route left a whole checkpoint under ``~/.cache/vlrl/vllm/weights``:
178 of them (9.8 GB) on the development machine, and its disk filled under CI."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vlrl.vllm.checkpoint import LOCK, CheckpointWriter

NAME = "model.language_model.embed_tokens.weight"


@pytest.fixture
def served(tmp_path, monkeypatch) -> Path:
    """A served checkpoint dir (one tensor + a config) with the cache under ``tmp_path/cache``."""
    monkeypatch.setenv("VLRL_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    save_file({NAME: torch.zeros(4, 3)}, str(model / "model.safetensors"))
    (model / "config.json").write_text("{}\n")
    return model


def _weights(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "vllm" / "weights"


def _sync(writer: CheckpointWriter, version: int) -> Path:
    writer.merge([(NAME, torch.full((4, 3), float(version)))])
    path = writer.write(version)
    writer.prune(path)
    return path


def test_one_version_on_disk_then_nothing_after_close(served, tmp_path):
    writer = CheckpointWriter(served)
    first = _sync(writer, 1)
    second = _sync(writer, 2)
    assert writer.root.parent == _weights(tmp_path) and writer.root.name.startswith(f"{socket.gethostname()}-")
    assert not first.exists() and sorted(p.name for p in writer.root.iterdir()) == [LOCK, "v2"]
    assert {p.name for p in second.iterdir()} == {"config.json", "model.safetensors", "vlrl_weights.json"}
    writer.close()
    writer.close()  # idempotent
    assert not writer.root.exists()


def test_a_dropped_writer_removes_its_copy(served):
    writer = CheckpointWriter(served)
    root = _sync(writer, 1).parent
    del writer  # as WeightSync does when a push or a reload replaces the merged copy
    assert not root.exists()


def test_a_given_root_keeps_what_the_writer_did_not_write(served, tmp_path):
    root = tmp_path / "mine"
    (root / "vision").mkdir(parents=True)  # a "v…" name that is no version of the writer's
    (root / "notes.txt").write_text("keep\n")
    writer = CheckpointWriter(served, root)
    _sync(writer, 3)
    writer.close()
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt", "vision"]


def test_process_exit_removes_the_copy_but_a_forked_childs_does_not(served, tmp_path):
    """No close, no del: the interpreter's exit still cleans up (``weakref.finalize`` runs at exit) — in the
    writer's own process only: a forked child that exits normally runs the same exit hooks."""
    code = (
        "import os, sys, torch; from vlrl.vllm.checkpoint import CheckpointWriter as W\n"
        f"w = W(sys.argv[1]); w.merge([({NAME!r}, torch.ones(4, 3))]); root = w.write(1).parent\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    sys.exit(0)\n"
        "os.waitpid(pid, 0); print(root, root.exists())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(served)], env=os.environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    root, after_child = out.stdout.split()
    assert after_child == "True" and Path(root).parent == _weights(tmp_path) and not Path(root).exists()


def test_a_new_writer_sweeps_the_copies_nobody_owns(served, tmp_path):
    """Owned: a writer's process holds the flock on its lock file (the kernel lets go when it dies, whatever host or
    PID namespace it ran in). A free lock is trusted only a minute after the last change; a copy of vlrl before the
    lock (no lock file) only a day after."""
    base, hour_ago, two_days_ago = _weights(tmp_path), time.time() - 3600, time.time() - 2 * 86400
    dirs = {name: base / f"{socket.gethostname()}-1-{name}" for name in ("dead", "held", "fresh", "old", "recent")}
    for name, d in dirs.items():
        (d / "v5").mkdir(parents=True)
        if name in ("dead", "held", "fresh"):
            (d / LOCK).touch()
    held = os.open(dirs["held"] / LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a live writer elsewhere does
    for name, when in (("dead", hour_ago), ("held", hour_ago), ("old", two_days_ago), ("recent", hour_ago)):
        os.utime(dirs[name], (when, when))
    try:
        writer = CheckpointWriter(served)
    finally:
        os.close(held)
    left = {p.name.rsplit("-", 1)[1] for p in base.iterdir() if p != writer.root}
    assert left == {"held", "fresh", "recent"}, left
    writer.close()
