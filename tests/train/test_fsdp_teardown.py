"""A torchrun training run leaves its process group with gloo's threads stopped, not running into
interpreter exit, where tearing them down sometimes killed a rank of a finished run with SIGABRT
("terminate called without an active exception")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fsdp_helpers import STEPS

SCRIPT = Path(__file__).with_name("torchrun_teardown.py")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from /proc")
def test_a_torchrun_run_ends_with_no_gloo_thread_left(tmp_path):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(SCRIPT)]
    argv += [*STEPS, "run.steps=1", f"run.out={tmp_path / 'run'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in ranks) == [0, 1], done.stdout
    for r in ranks:
        assert r["steps"] == 1
        assert not [t for t in r["threads"] if "gloo" in t], r  # pt_gloo_runloop, gloo_tcp_loop
