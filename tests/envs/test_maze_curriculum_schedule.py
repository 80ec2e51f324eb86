"""The maze curriculum's SFT learning-rate schedule (clock-based): warm-up ramp, then linear decay to 10 %."""

from __future__ import annotations

import pytest

from vlrl.envs.maze_curriculum import sft_lr_factor


def test_without_warmup_the_lr_decays_linearly_from_full_to_a_tenth():
    assert sft_lr_factor(0.0, 100.0) == 1.0
    assert sft_lr_factor(50.0, 100.0) == pytest.approx(0.5)
    assert sft_lr_factor(99.0, 100.0) == pytest.approx(0.1)  # floored at 10 %
    assert sft_lr_factor(200.0, 100.0) == pytest.approx(0.1)


def test_warmup_ramps_from_near_zero_to_the_decay_curve():
    ramp = [sft_lr_factor(t, 100.0, warmup=20.0, step_seconds=1.0) for t in (0.0, 4.0, 9.0, 19.0, 30.0)]
    assert ramp[0] == pytest.approx(0.05)  # the first step: a twentieth of the peak, not 0
    assert ramp[1] == pytest.approx(0.25 * 0.96)
    assert ramp[2] == pytest.approx(0.5 * 0.91)
    assert ramp[3] == pytest.approx(0.81)  # warm-up over: the decay alone
    assert ramp[4] == pytest.approx(0.70)
    assert all(a < b for a, b in zip(ramp[:4], ramp[1:4], strict=False))


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
