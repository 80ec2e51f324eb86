"""benchmarks/device/lease.sh, run here as on the device (LEASE_LOCAL: without the device's env): the call that starts
the curriculum returns while it trains, from a session of its own (the device ends every process of a returned
command but those), and a later call brings back the run's log and its final weights as parts that load."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

ROOT = Path(__file__).resolve().parents[2]
PLAN = ["--plan", "5x5:600:0:1", "--snapshot-seconds", "1e-6"]
CPU = [a for s in (*cpu_overrides(), "sft.steps=2", "data.eval_rows=2") for a in ("--set", s)]


def lease(tmp_path, *args, limit: int) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for f in out.iterdir():  # the device empties $OUT before each call
        f.unlink()
    env = os.environ | {
        "LEASE_LOCAL": "1",
        "LEASE_DIR": str(tmp_path / "lease"),
        "OUT": str(out),
        "LIMIT": str(limit),
        "OMP_NUM_THREADS": "1",  # a pytest worker's share of the cores
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3 = this interpreter
    }
    cmd = ["bash", "benchmarks/device/lease.sh", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.train
def test_the_run_outlives_the_call_that_started_it_and_a_later_call_brings_back_its_weights(tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    sys.path.insert(0, str(ROOT / "benchmarks" / "device"))
    from weights_parts import unpack

    try:
        started = lease(tmp_path, "start", "t", *PLAN, *CPU, limit=0)
        assert started.returncode == 0, started.stdout + started.stderr
        pid = int((tmp_path / "lease" / "pid").read_text())
        assert not (tmp_path / "lease" / "rc").exists(), "the start call waited for the run"
        assert os.getsid(pid) == pid != os.getsid(0), "the run must lead a session of its own"
        assert "the run goes on" in started.stdout
        watched = lease(tmp_path, "watch", "t", limit=300)
        assert watched.returncode == 0 and "the run ended: rc 0" in watched.stdout, watched.stdout + watched.stderr
        assert '5x5 last: {"step": 0, "phase": "eval"' in watched.stdout  # where the level stands: its eval came last
        assert "  2 SFT steps, median s: batch_s " in watched.stdout  # and where its steps' time went
        out = tmp_path / "out"
        assert '"level": "5x5"' in (out / "t-2.log").read_text()
        with tarfile.open(out / "t-2.tgz") as tar:
            names = tar.getnames()
        assert "./5x5/metrics.jsonl" in names and not [n for n in names if "weights" in n or "snapshots" in n]
        final = tmp_path / "lease" / "mc" / "5x5" / "weights"
        assert "packed " + str(final) in watched.stdout  # the level's end, newer than its snapshots
        unpacked = unpack(out, tmp_path / "back")
        got = AutoModelForImageTextToText.from_pretrained(unpacked).state_dict()
        want = AutoModelForImageTextToText.from_pretrained(final).state_dict()
        assert all(torch.equal(got[k], want[k].to(torch.bfloat16).to(want[k].dtype)) for k in want)
        again = lease(tmp_path, "watch", "t", limit=0)
        assert "packed" not in again.stdout and not list(out.glob("part.*"))  # brought back once
    finally:
        lease(tmp_path, "stop", "t", limit=0)  # a run a failed check left going


def test_a_run_ended_from_outside_is_reported_and_the_next_start_keeps_its_dir(tmp_path):
    """Where the device runs commands as an ordinary user it ends every process of that user with the call (the
    device README): the next watch says the run was ended outside it, and a new start keeps the old dir as .prev,
    whose newest weights a run can go on from."""
    import signal

    try:
        started = lease(tmp_path, "start", "t", *PLAN, *CPU, limit=0)
        pid = int((tmp_path / "lease" / "pid").read_text())
        os.killpg(pid, signal.SIGKILL)  # the run's session, as the machine would end it
        time.sleep(0.5)
        watched = lease(tmp_path, "watch", "t", limit=60)
        assert "the run was ended outside it" in watched.stdout, started.stdout + watched.stdout + watched.stderr
        assert "the run ended: rc the run was ended outside it" in watched.stdout  # not waited for
        again = lease(tmp_path, "start", "u", *PLAN, *CPU, limit=0)
        assert again.returncode == 0 and (tmp_path / "lease.prev" / "pid").read_text() == f"{pid}\n"
    finally:
        lease(tmp_path, "stop", "t", limit=0)
