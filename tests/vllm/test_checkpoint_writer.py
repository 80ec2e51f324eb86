"""The checkpoint route's merged copy is scratch: it must leave nothing on disk behind it — not on close, not
when dropped, not at exit, and not after a killed process (the next writer sweeps it). Before this, every vLLM
engine that synced through the checkpoint route left a whole checkpoint under ``~/.cache/vlrl/vllm/weights``:
178 of them (9.8 GB) on the development machine, and its disk filled under CI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vlrl.vllm.checkpoint import CheckpointWriter

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
    assert not first.exists() and sorted(p.name for p in writer.root.iterdir()) == ["v2"]
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
    root.mkdir()
    (root / "notes.txt").write_text("keep\n")
    writer = CheckpointWriter(served, root)
    _sync(writer, 3)
    writer.close()
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]


def test_process_exit_removes_the_copy(served, tmp_path):
    """No close, no del: the interpreter's exit still cleans up (``weakref.finalize`` runs at exit)."""
    code = (
        "import sys, torch; from vlrl.vllm.checkpoint import CheckpointWriter as W\n"
        f"w = W(sys.argv[1]); w.merge([({NAME!r}, torch.ones(4, 3))]); print(w.write(1).parent)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(served)], env=os.environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    root = Path(out.stdout.strip())
    assert root.parent == _weights(tmp_path) and not root.exists()


def test_a_new_writer_sweeps_the_copies_of_dead_processes_of_this_host(served, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host, base = socket.gethostname(), _weights(tmp_path)
    names = {
        "killed": f"{host}-{dead.pid}-7f00aa",
        "old_format": f"{dead.pid}-7f00bb",  # written before the host was in the name
        "other_host": f"not-{host}-{dead.pid}-7f00cc",  # its pid says nothing about a process here
        "alive": f"{host}-{os.getpid()}-7f00dd",
    }
    for name in names.values():
        (base / name / "v5").mkdir(parents=True)
    writer = CheckpointWriter(served)
    left = {p.name for p in base.iterdir()}
    assert left == {names["other_host"], names["alive"]}, left
    writer.close()
