"""The tiny color_square recipe learns on 2 CPU cores: from a random init to >= 0.9 eval reward.

Its report row (curves, logprob drift, rollout frames) is in reports/tests.html.
"""

from __future__ import annotations

import pytest


@pytest.mark.train
def test_color_square_recipe_learns(vlrl_train):
    run = vlrl_train("color_square")
    evals = {e["label"]: e["eval_reward_mean"] for e in run.record.phase("eval")}
    assert evals["before"] <= 0.3, f"the random init should be at or below chance, got {evals}"
    run.assert_learned(0.9)
    run.assert_agreement_held()
    run.assert_all_parameters_changed()
    assert len(run.record.phase("rl")) == run.cfg.run.steps
    assert run.summary["seconds"] < 600, run.summary
