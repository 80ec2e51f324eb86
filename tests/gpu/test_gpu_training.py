"""GPU training runs with pass criteria (`pytest -m gpu`; skipped cleanly without CUDA).

Every run keeps ``run.agreement=stop`` (the recipes' default): a rollout-vs-trainer disagreement beyond
the dtype's bound (``vlrl.checks.bounds``) ends it with an error, so each passing run is also an
agreement check at every RL step. Runs that should learn assert that they did; every run asserts that
all parameters moved, and the runs with images assert the image-sensitivity probe after SFT and at the end.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "bfloat16"]


def test_color_square_learns_on_gpu_in_bf16(vlrl_train):
    run = vlrl_train(
        "color_square",
        "model.device=cuda",
        "model.dtype=bfloat16",
        "run.steps=10",
        "run.image_probe=True",
        "data.eval_rows=32",
    )
    evals = {e["label"]: e["eval_reward_mean"] for e in run.record.phase("eval")}
    assert evals["before"] <= 0.3, evals
    run.assert_learned(0.9)
    run.assert_agreement_held()
    run.assert_all_parameters_changed()
    run.assert_images_mattered()


@pytest.mark.parametrize("dtype", DTYPES)
def test_smallest_maze_sft_then_grpo(vlrl_train, dtype):
    """maze2d/5x5 (every expert: 4 moves + stop), multi-turn with an image back after every move: SFT
    learns (its loss falls), then GRPO steps keep agreement at every step in both dtypes."""
    run = vlrl_train(
        "maze2d",
        "data.env=maze2d/5x5",
        f"model.dtype={dtype}",
        "sft.steps=60",
        "sft.rows_per_step=16",
        "run.steps=2",
        "rollout.rows_per_step=8",
        "data.eval_rows=16",
        "run.eval_every=0",
    )
    sft = [m["loss"] for m in run.record.phase("sft")]
    assert len(sft) == 60 and sum(sft[-5:]) / 5 < sum(sft[:5]) / 5 / 3, sft
    assert [e["label"] for e in run.record.phase("eval")] == ["before", "after_sft", "after"]
    run.assert_agreement_held()
    run.assert_all_parameters_changed()
    bins = {b["bin"] for a in run.record.agreement for b in a["by_turn_position"]}
    assert bins == {"first", "rest"}, bins


def test_geometry_grpo_runs_with_agreement_held(vlrl_train):
    """geometry: SFT on boxed answers, then GRPO. A tiny random-init model cannot solve the problems, so
    reward is not expected to move; the run must keep agreement (tool-call turns, up to 3), and every
    parameter moves (SFT's gradient reaches the vision tower through the diagram's tokens)."""
    run = vlrl_train(
        "geometry",
        "sft.steps=10",
        "run.steps=2",
        "rollout.rows_per_step=4",
        "rollout.repeats=4",
        "rollout.max_tokens=48",
        "data.eval_rows=8",
        "run.eval_every=0",
    )
    assert len(run.record.phase("rl")) == 2 and len(run.record.phase("sft")) == 10
    run.assert_agreement_held()
    run.assert_all_parameters_changed()
