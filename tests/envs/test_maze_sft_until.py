"""The maze curriculum's early SFT stop (``LevelPlan.sft_until``): SFT ends at the first probe that reaches the
fraction, on training mazes, and the probe is a real greedy rollout of the current weights. And a level's weights are
on disk once SFT ends, before the eval that a command's clock may cut."""

from __future__ import annotations

import json
import time

import pytest
from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

from vlrl.envs import maze_curriculum
from vlrl.envs.maze_curriculum import LevelPlan, level_config, sft_phase

CPU = cpu_overrides()


def test_sft_stops_at_the_first_probe_that_reaches_the_fraction(tmp_path, monkeypatch):
    from vlrl.train.run import Run

    real = maze_curriculum.probe_success
    seen: list[tuple[float, int, list[int]]] = []

    def probe(run, rows, step):  # the real probe, then a policy that "reaches" the fraction at the third probe
        value = real(run, rows, step)
        seen.append((value, step, [r.seed for r in rows]))
        return 0.75 if len(seen) == 3 else value

    monkeypatch.setattr(maze_curriculum, "probe_success", probe)
    plan = LevelPlan(
        "5x5", 600, 0, overrides=(*CPU, "sft.steps=6"), sft_pool=1, sft_until=0.5, probe_rows=3, probe_seconds=0.0
    )
    run = Run(level_config(plan, tmp_path))
    try:
        steps, _ = sft_phase(run, time.time() + plan.sft_seconds, plan)
        eval_seeds = {r.seed for r in run.eval_rows}
        after = maze_curriculum.evaluate(run, steps, "after_sft")  # the same greedy rollouts on the eval split
        lines = [json.loads(x) for x in (run.log.dir / "metrics.jsonl").read_text().splitlines()]
    finally:
        run.close()
    timed = [x for x in lines if x["phase"] == "eval"][-1]
    assert 0 < timed["eval_decode_s"] < timed["eval_s"]  # the eval's seconds, the embedded engine's decoding among them
    assert steps == 2 and [s for _, s, _ in seen] == [0, 1, 2]  # a probe before each step; the third ends SFT (cap 6)
    assert seen[0][0] == 0.0  # random init solves none of the real probe's mazes
    assert len(seen[0][2]) == 3 and not eval_seeds & set(seen[0][2])  # training mazes, not the eval split
    assert (after.label, after.solved, after.episodes) == ("after_sft", 0, 4)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["probe_episodes"] for m in metrics if m["phase"] == "probe"] == [3, 3, 3]
    assert [m["eval_episodes"] for m in metrics if m["phase"] == "eval"] == [4]


def test_without_sft_until_no_probe_runs(tmp_path, monkeypatch):
    from vlrl.train.run import Run

    monkeypatch.setattr(maze_curriculum, "probe_success", lambda *a: (_ for _ in ()).throw(AssertionError("probed")))
    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=2"), sft_pool=1, probe_seconds=0.0)
    run = Run(level_config(plan, tmp_path))
    try:
        steps, _ = sft_phase(run, time.time() + plan.sft_seconds, plan)
    finally:
        run.close()
    assert steps == 2


def _weights_after_sft(monkeypatch) -> dict:
    """The model's state as each SFT phase ends (the real phase, then a copy of the weights it left)."""
    trained: dict = {}
    real_sft = maze_curriculum.sft_phase

    def sft(run, deadline, plan):
        out = real_sft(run, deadline, plan)
        trained.update({k: v.detach().clone() for k, v in run.model.state_dict().items()})
        return out

    monkeypatch.setattr(maze_curriculum, "sft_phase", sft)
    return trained


def test_a_clock_that_cuts_the_eval_keeps_the_sft_weights(tmp_path, monkeypatch):
    """The level's weights are written when SFT ends, before its eval: on the GPU a 10-minute command's clock
    killed easy's after-SFT eval (200 mazes of up to 30 turns) and, with the weights written only at the end,
    took the 197 SFT steps with it."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlrl.envs.maze_curriculum import train_level

    def cut(*args, **kwargs):
        raise KeyboardInterrupt("the command's clock")

    trained = _weights_after_sft(monkeypatch)
    monkeypatch.setattr(maze_curriculum, "evaluate", cut)
    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=2"), sft_pool=1)
    with pytest.raises(KeyboardInterrupt, match="clock"):
        train_level(plan, tmp_path)
    assert (tmp_path / "weights" / "model.safetensors").is_file(), "the cut eval took the SFT weights with it"
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "weights").state_dict()  # as the next level
    assert reloaded.keys() == trained.keys() and all(torch.equal(reloaded[k], trained[k]) for k in trained)


def test_a_level_continued_from_its_own_weights_directory_saves_over_it(tmp_path, monkeypatch):
    """``--weights /tmp/mc/easy/weights`` with ``--out /tmp/mc`` (a level continued from the directory it saves to):
    on the GPU, deleting the directory before copying its files lost the call's SFT at the save (chain_v14)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from vlrl.envs.maze_curriculum import train_level

    trained = _weights_after_sft(monkeypatch)
    unrun = maze_curriculum.EvalResult("after_sft", 0, 0, 0.0, 1.0)  # the evals are not what this test is about
    monkeypatch.setattr(maze_curriculum, "evaluate", lambda *a: unrun)
    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=1"), sft_pool=1)
    first = train_level(plan, tmp_path)
    before = {k: v.clone() for k, v in trained.items()}
    again = train_level(plan, tmp_path, model_path=first.weights)
    assert again.weights == first.weights and not list(tmp_path.glob("*.new"))
    reloaded = AutoModelForImageTextToText.from_pretrained(again.weights).state_dict()
    assert all(torch.equal(reloaded[k], trained[k]) for k in trained)  # the continued SFT's weights, on disk
    assert any(not torch.equal(before[k], trained[k]) for k in trained)  # it started from the first and moved on
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval_before"] is None and summary["eval_after"] == 0.0  # no eval before SFT (evals[0] is after)
