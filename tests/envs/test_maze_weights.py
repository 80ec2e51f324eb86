"""Snapshots of a level's weights during SFT (``LevelPlan.snapshot_seconds``), for a process that trains a whole
device lease while a watcher packs what it leaves (``benchmarks/device/lease.sh``): each snapshot is a loadable model
directory of the weights at its step, the newest two stay, and ``newest`` finds the latest complete one."""

from __future__ import annotations

import os
import time

import pytest
from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

from vlrl.envs.maze_curriculum import LevelPlan, level_config, sft_phase
from vlrl.envs.maze_weights import SUFFIX, Snapshots, newest

CPU = cpu_overrides()


def test_sft_leaves_a_loadable_snapshot_of_each_step_and_keeps_the_newest_two(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForImageTextToText

    from vlrl.envs import maze_weights
    from vlrl.train.run import Run

    seen: dict[int, dict[str, torch.Tensor]] = {}
    real = maze_weights.save_weights

    def save(run, dest):  # the real save, and the weights it saved
        seen[int(dest.name.removeprefix("step_"))] = {k: v.clone() for k, v in run.model.state_dict().items()}
        return real(run, dest)

    monkeypatch.setattr(maze_weights, "save_weights", save)
    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=3"), sft_pool=1, snapshot_seconds=1e-6)
    run = Run(level_config(plan, tmp_path))
    try:
        steps, _ = sft_phase(run, time.time() + plan.sft_seconds, plan)
        final = {k: v.clone() for k, v in run.model.state_dict().items()}
    finally:
        run.close()
    assert steps == 3 and sorted(seen) == [1, 2, 3]  # one after every step (every 1 µs)
    kept = sorted(p.name for p in (tmp_path / "snapshots").iterdir())
    assert kept == ["step_000002", "step_000003"]  # step 1's went when step 3's came
    assert not any(seen[1][k].equal(seen[2][k]) for k in ("lm_head.weight",))  # the steps trained
    for step in (2, 3):
        loaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "snapshots" / f"step_{step:06d}").state_dict()
        assert all(torch.equal(loaded[k], seen[step][k]) for k in seen[step]), f"step {step}'s snapshot"
    assert all(torch.equal(seen[3][k], final[k]) for k in final)  # the last snapshot is the phase's end
    assert newest(tmp_path) == tmp_path / "snapshots" / "step_000003"


def test_without_snapshot_seconds_sft_saves_none(tmp_path):
    from vlrl.train.run import Run

    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=2"), sft_pool=1)
    run = Run(level_config(plan, tmp_path))
    try:
        sft_phase(run, time.time() + plan.sft_seconds, plan)
    finally:
        run.close()
    assert not (tmp_path / "snapshots").exists() and newest(tmp_path) is None


def test_newest_is_the_latest_complete_directory_and_skips_those_being_written(tmp_path):
    def model_dir(path, written):
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        (path / "model.safetensors").write_bytes(b"w")
        os.utime(path / "model.safetensors", (written, written))

    model_dir(tmp_path / "7x7" / "weights", 100)
    model_dir(tmp_path / "easy" / "snapshots" / "step_000040", 200)
    model_dir(tmp_path / "easy" / "snapshots" / "step_000080", 300)
    model_dir(tmp_path / "easy" / "snapshots" / ("step_000120" + SUFFIX), 400)  # half written
    (tmp_path / "easy" / "samples").mkdir()
    (tmp_path / "easy" / "samples" / "x.safetensors").write_bytes(b"not a model dir: no config.json")
    assert newest(tmp_path) == tmp_path / "easy" / "snapshots" / "step_000080"
    model_dir(tmp_path / "easy" / "weights", 500)  # the level ended
    assert newest(tmp_path) == tmp_path / "easy" / "weights"
    assert newest(tmp_path / "5x5") is None


def test_snapshots_refuse_a_negative_period():
    with pytest.raises(ValueError, match="every -1"):
        Snapshots(None, "x", every=-1)
