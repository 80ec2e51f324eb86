"""Checkpoints, unit by unit: a save killed half-way leaves no checkpoint (and the previous one newest),
a replacement killed between its renames gives the old one back, loading never runs pickled code,
and a resume continues SFT from its step exactly, with the logs trimmed to the checkpoint."""

from __future__ import annotations

import json
import os

import pytest
import torch

from vlrl.train.checkpoint import RunState, latest_checkpoint, load_checkpoint, remove_partial, save_checkpoint
from vlrl.train.config import load_config
from vlrl.train.loop import train

TINY = (
    "sft.steps=3",
    "sft.rows_per_step=4",
    "rollout.rows_per_step=4",
    "rollout.repeats=2",
    "data.eval_rows=4",
    "data.train_rows=16",
    "run.steps=1",
    "run.eval_every=0",
    "run.samples=1",
    "run.progress=False",
    "run.checkpoint_every=1",
)


class Crash(Exception):
    pass


def model():
    return torch.nn.Linear(3, 2)


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_newest(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    save_checkpoint(root / "step_000001", model(), None, RunState(rl_step=1))
    real_save = torch.save
    calls = []

    def dying_save(obj, f, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Crash("killed")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(Crash):
        save_checkpoint(root / "step_000002", model(), None, RunState(rl_step=2))
    monkeypatch.setattr(torch, "save", real_save)
    assert not (root / "step_000002").exists() and latest_checkpoint(tmp_path).name == "step_000001"
    save_checkpoint(root / "step_000002", model(), None, RunState(rl_step=2))
    assert sorted(p.name for p in root.iterdir()) == ["step_000001", "step_000002"]  # the leftover is gone


def test_a_replacement_killed_between_renames_gives_the_old_checkpoint_back(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    save_checkpoint(root / "step_000001", model(), None, RunState(rl_step=1, eval_before=0.5))
    real_replace = os.replace

    def dying_replace(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(".old-step_000001"):
            raise Crash("killed between the renames")

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(Crash):
        save_checkpoint(root / "step_000001", model(), None, RunState(rl_step=1, eval_before=0.75))
    monkeypatch.setattr(os, "replace", real_replace)
    assert latest_checkpoint(tmp_path) is None  # only a hidden directory is left ...
    remove_partial(root)  # ... which a resume puts back first
    state, _ = load_checkpoint(latest_checkpoint(tmp_path), model())
    assert state.eval_before == 0.5


def test_loading_never_unpickles_code(tmp_path):
    path = save_checkpoint(tmp_path / "step_000001", model(), None, RunState(rl_step=1))
    torch.save({"weight": Crash("not a tensor")}, path / "model.pt")  # any pickled object, not only tensors
    with pytest.raises(Exception, match="Weights only load failed"):
        load_checkpoint(path, model())


def test_resume_mid_sft_continues_exactly_and_trims_the_logs(tmp_path):
    full = tmp_path / "full"
    train(load_config("color_square", [*TINY, f"run.out={full}"]))
    sft_rows = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines() if '"sft"' in x]
    assert sorted(p.name for p in (full / "checkpoints").iterdir()) == [
        "sft_000001",
        "sft_000002",
        "step_000000",
        "step_000001",
    ]
    # resume from the first SFT checkpoint, in place: logs after it are cut, newer checkpoints dropped, SFT goes on
    train(load_config("color_square", [*TINY, f"run.out={full}", f"run.resume={full / 'checkpoints' / 'sft_000001'}"]))
    again = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    assert [(m["phase"], m["step"]) for m in again] == [
        ("eval", 0),
        ("sft", 1),
        ("sft", 2),
        ("sft", 3),
        ("eval", 0),
        ("rl", 1),
        ("eval", 1),
    ]
    assert [m["loss"] for m in again if m["phase"] == "sft"] == [m["loss"] for m in sft_rows]
    summary = json.loads((full / "summary.json").read_text())
    assert summary["eval_before"] == again[0]["eval_reward_mean"]
