"""The maze curriculum's SFT learning-rate schedule: a warm-up ramp over steps, then a linear decay to 10 % with the
clock."""

from __future__ import annotations

import pytest

from vlrl.envs.maze_curriculum import sft_lr_factor


def test_without_warmup_the_lr_decays_linearly_from_full_to_a_tenth():
    assert sft_lr_factor(0.0, 100.0) == 1.0
    assert sft_lr_factor(50.0, 100.0) == pytest.approx(0.5)
    assert sft_lr_factor(99.0, 100.0) == pytest.approx(0.1)  # floored at 10 %
    assert sft_lr_factor(200.0, 100.0) == pytest.approx(0.1)


def test_warmup_ramps_over_steps_from_zero_to_the_decay_curve():
    ramp = [sft_lr_factor(t, 100.0, step, warmup_steps=4) for t, step in ((0.0, 0), (1.0, 1), (2.0, 2), (30.0, 4))]
    assert ramp[0] == 0.25  # the trainer's ramp (warmup_factor): step k at (k + 1) / 4
    assert ramp[1] == pytest.approx(0.5 * 0.99)
    assert ramp[2] == pytest.approx(0.75 * 0.98)
    assert ramp[3] == pytest.approx(0.70)  # warm-up over: the decay alone


def _sft_rows_with_a_slow_first_batch(tmp_path, monkeypatch) -> list[dict]:
    """Four SFT steps of a CPU 5x5 level whose first batch takes 1 s longer to come: its metrics rows."""
    import json
    import time

    from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

    from vlrl.envs import maze_sft_pool
    from vlrl.envs.maze_curriculum import LevelPlan, level_config, sft_phase
    from vlrl.train.run import Run

    real = maze_sft_pool.SftPool._next

    def slow_first(pool, k, first):
        if k == 0:
            time.sleep(1.0)
        return real(pool, k, first)

    monkeypatch.setattr(maze_sft_pool.SftPool, "_next", slow_first)
    plan = LevelPlan("5x5", 6000, 0, overrides=(*cpu_overrides(), "sft.steps=4"), sft_pool=1, sft_warmup_steps=4)
    run = Run(level_config(plan, tmp_path))
    try:
        sft_phase(run, time.time() + plan.sft_seconds, plan)
        rows = [json.loads(line) for line in (run.log.dir / "metrics.jsonl").read_text().splitlines()]
    finally:
        run.close()
    return [r for r in rows if r["phase"] == "sft"]


def test_a_slow_first_batch_does_not_use_up_the_warmup(tmp_path, monkeypatch):
    """The ramp counts optimizer steps: a level whose first batch takes longer than the old ramp's seconds (its first
    step ended 15-30 s into a level on the farm) still trains its second step at a fraction of the peak (lease_v2's
    ran at 0.97 of it, and a trained policy's loss went 0.030 -> 0.323)."""
    factors = [r["lr_factor"] for r in _sft_rows_with_a_slow_first_batch(tmp_path, monkeypatch)]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=0.01)  # the decay over 6,000 s: < 1 %


def test_a_steps_metrics_say_where_its_time_went(tmp_path, monkeypatch):
    """``batch_s`` (waiting for the pool), ``to_device_s`` (the copy) and ``update_s`` split a step: the slow first
    batch's second shows in its ``batch_s`` and nowhere else, and the three add up to the step's time (lease_v5's
    easy step took 2.12 s where an update alone took 1.27 s, and its metrics did not say where the rest went)."""
    rows = _sft_rows_with_a_slow_first_batch(tmp_path, monkeypatch)
    assert rows[0]["batch_s"] >= 1.0 and all(r["batch_s"] < 0.5 for r in rows[1:])
    assert all(r["update_s"] > 0 and r["to_device_s"] >= 0 for r in rows)
    assert all(r["update_s"] < 1.0 for r in rows)  # the sleep is not counted as the update's
    for before, row in zip(rows, rows[1:]):  # a row's time stamp comes after its step: the gap is one step (+ logging)
        split = row["batch_s"] + row["to_device_s"] + row["update_s"]
        assert split - 0.01 <= row["time"] - before["time"] <= split + 0.5  # time is logged in ms


def test_the_small_model_is_built_in_the_levels_arch(tmp_path):
    """``--model small --set model.arch=qwen3_vl`` starts from a Qwen3-VL small model, not Qwen2.5-VL's weights
    under a Qwen3-VL config."""
    import json

    from vlrl.envs.maze_curriculum import LevelPlan, start_weights

    plan = LevelPlan("5x5", 0, 0, overrides=("model.arch=qwen3_vl",), model="small")
    path = start_weights(plan, tmp_path, None)
    assert json.loads((path / "vlrl_model.json").read_text())["arch"] == "qwen3_vl"
    assert start_weights(plan, tmp_path, "/given") == "/given"
    assert start_weights(LevelPlan("5x5", 0, 0), tmp_path, None) is None  # tiny: the config's named size


def test_a_plan_with_the_fan_in_init_starts_from_its_own_random_init_checkpoint(tmp_path):
    import json

    from vlrl.envs.maze_curriculum import LevelPlan, start_weights

    plan = LevelPlan("5x5", 0, 0, init="fan_in")
    manifest = json.loads((start_weights(plan, tmp_path, None) / "vlrl_model.json").read_text())
    assert (manifest["arch"], manifest["size"], manifest["init"]) == ("qwen2_5_vl", "maze_tiny", "fan_in")


def test_the_old_seconds_flag_is_refused_in_one_line_not_read_as_steps(tmp_path):
    """``--sft-warmup 10`` (seconds, in the records of runs before lease_v2) would otherwise be argparse's
    abbreviation of ``--sft-warmup-steps``: 10 steps, silently."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "maze_curriculum.py"
    args = [sys.executable, str(script), "--out", str(tmp_path), "--plan", "5x5:1:0", "--sft-warmup", "10"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "argument --sft-warmup: the warm-up counts steps now: use --sft-warmup-steps N" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing ran
