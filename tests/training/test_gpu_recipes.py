"""GPU training runs (`pytest -m gpu`; skipped cleanly where CUDA is absent)."""

from __future__ import annotations

import pytest


@pytest.mark.gpu
def test_maze2d_sft_then_grpo_runs_with_agreement_logged(vlrl_train):
    run = vlrl_train("maze2d", "sft.steps=10", "sft.rows_per_step=8", "run.steps=2", "rollout.rows_per_step=4",
                     "data.eval_rows=4", "run.eval_every=0", "run.agreement=log", 'data.extras={"max_turns":12}')
    assert [e["label"] for e in run.record.phase("eval")] == ["before", "after_sft", "after"]
    assert len(run.record.agreement) == 2
    run.assert_all_parameters_changed()


@pytest.mark.parametrize("recipe", ["maze2d", "geometry"])
def test_gpu_recipes_load(recipe):  # no GPU needed to parse them: part of the default run
    from vlrl.train.config import load_config

    assert load_config(recipe).model.device == "cuda"
