"""Checkpoints survive SIGKILL at any instant: a real ``vlrl train`` process is killed at random moments
(SFT steps, RL steps, evaluations, checkpoint writes, log trimming), resumed each time with
``run.resume=latest``, and the finished run must be the uninterrupted one: every step logged once
(metrics, agreement, TensorBoard), the first ``eval_before`` kept, every checkpoint complete, and the
same losses as a run that was never killed.

The kill instants are drawn from ``VLRL_KILL_SEED`` (random when unset; the seed is in every failure
message), at most ``KILLS`` of them, each within the first 90 % of the uninterrupted run's working time (measured
in this test: a fixed window outlived the run once the engine got faster, and a kill that never came proved nothing).
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from vlrl.train.checkpoint import RunState

KILLS = 3
RUN = (
    "sft.steps=3",
    "sft.rows_per_step=4",
    "rollout.rows_per_step=4",
    "rollout.repeats=2",
    "data.eval_rows=4",
    "data.train_rows=16",
    "run.steps=3",
    "run.checkpoint_every=1",
    "run.eval_every=2",
    "run.samples=1",
    "run.progress=False",
    "algo.kl_coef=0.05",
)


def start(out: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vlrl.cli", "train", "color_square", *RUN, f"run.out={out}", "run.resume=latest"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for_work(out: Path, proc: subprocess.Popen) -> None:
    """Until the run writes its config: model loaded, resumed (logs trimmed), about to work."""
    deadline = time.monotonic() + 120
    while not (out / "config.toml").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def timed_run(out: Path) -> float:
    """The uninterrupted run, in a process as the killed ones are; seconds from its work beginning to its end."""
    proc = start(out)
    wait_for_work(out, proc)
    began = time.monotonic()
    assert proc.wait(timeout=300) == 0, f"the uninterrupted run failed: {proc.stderr.read()[-3000:]}"
    return time.monotonic() - began


def kill_at_random(out: Path, rng: random.Random, seed: int, window: float) -> int:
    """Start, wait for the run's work to begin, SIGKILL after a random delay; the number of kills done."""
    kills = 0
    for _ in range(KILLS):
        (out / "config.toml").unlink(missing_ok=True)
        proc = start(out)
        wait_for_work(out, proc)
        time.sleep(rng.uniform(0.0, window))
        if proc.poll() is not None:
            assert proc.returncode == 0, f"seed {seed}: the run failed: {proc.stderr.read()[-2000:]}"
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        kills += 1
    return kills


def test_sigkill_at_random_instants_then_resume_is_the_uninterrupted_run(tmp_path):
    seed = int(os.environ.get("VLRL_KILL_SEED", random.randrange(2**31)))
    reference, out = tmp_path / "reference", tmp_path / "killed"
    work = timed_run(reference)
    kills = kill_at_random(out, random.Random(seed), seed, window=0.9 * work)
    assert kills >= 1, f"seed {seed}: the run ended before the first kill ({work:.1f} s of work)"
    final = start(out)
    assert final.wait(timeout=300) == 0, f"seed {seed}: resume failed: {final.stderr.read()[-3000:]}"
    where = f"seed {seed}, {kills} kills"

    metrics = rows(out / "metrics.jsonl")
    keys = Counter((m["phase"], m["step"], m.get("label")) for m in metrics)
    assert [k for k, n in keys.items() if n > 1] == [], f"{where}: steps logged twice"
    assert keys == Counter((m["phase"], m["step"], m.get("label")) for m in rows(reference / "metrics.jsonl")), where
    assert [a["step"] for a in rows(out / "agreement.jsonl")] == [1, 2, 3], where
    assert tensorboard_counts(out / "tb") == tensorboard_counts(reference / "tb"), f"{where}: TensorBoard"
    for phase in ("sft", "rl"):
        for key in ("loss", "grad_norm"):
            got = [m[key] for m in metrics if m["phase"] == phase]
            want = [m[key] for m in rows(reference / "metrics.jsonl") if m["phase"] == phase]
            assert got == pytest.approx(want, rel=1e-5, abs=1e-7), f"{where}: {phase} {key}"
    summary = json.loads((out / "summary.json").read_text())
    before = next(m for m in metrics if m.get("label") == "before")
    assert summary["eval_before"] == before["eval_reward_mean"] is not None, where
    checkpoints = out / "checkpoints"
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")], f"{where}: leftovers"
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted(
        p.name for p in (reference / "checkpoints").iterdir()
    ), where
    for path in checkpoints.iterdir():
        RunState.from_json((path / "state.json").read_text())
        torch.load(path / "model.pt", weights_only=True)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tensorboard_counts(folder: Path) -> Counter:
    """``(tag, step) -> count`` over every event file (TFRecord framing, tensorboardX's Event proto)."""
    from tensorboardX.proto.event_pb2 import Event

    counts: Counter = Counter()
    for path in folder.glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                if not value.tag.endswith("/time"):
                    counts[(value.tag, event.step)] += 1
    return counts
