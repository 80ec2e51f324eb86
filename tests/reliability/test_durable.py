"""vlrl.durable: a file a run rewrites (``summary.json``, ``config.toml``) is the old one or the new one, never half;
and the run log's module, which writes through it, imports no torch (the crash-safe writes used to live in the
checkpoint module, which pulled torch into the run log and made an import circle through FSDP)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vlrl.durable import TMP_PREFIX, write_atomic


class Crash(Exception):
    pass


def test_write_atomic_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text('{"old": 1}')
    write_atomic(target, '{"new": 2}')
    assert target.read_text() == '{"new": 2}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_write_killed_before_its_rename_leaves_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text('{"old": 1}')

    def killed(src, dst):
        raise Crash("killed between the write and the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(Crash):
        write_atomic(target, '{"new": 2}' * 1000)
    assert target.read_text() == '{"old": 1}'
    assert (tmp_path / f"{TMP_PREFIX}summary.json").read_text() == '{"new": 2}' * 1000  # written whole, aside


def test_the_run_log_and_durable_writes_import_no_torch():
    code = "import sys, vlrl.durable, vlrl.train.metrics; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
