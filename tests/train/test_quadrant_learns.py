"""A user's env learns: examples/quadrant (which quadrant is the dot in?) trained by its own TOML to >= 0.9 eval
reward on 2 CPU cores, with the image probe confirming the policy reads the image.

The user's first run (examples/quadrant/quadrant_first_run.toml) stayed at chance; docs/why-didnt-it-learn.md
works through why and what changed. The env is registered from here (``data.env = "quadrant"``) until
``vlrl train`` loads ``module:factory`` envs itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quadrant"


@pytest.fixture
def quadrant_registered():
    """The example env and its SFT expert under the name ``quadrant``, removed again after the test."""
    from vlrl.envs.registry import EXPERTS, register_env, register_expert, unregister_env

    sys.path.insert(0, str(EXAMPLE))
    try:
        import quadrant_env

        register_env("quadrant", quadrant_env.registry_factory)
        register_expert("quadrant", quadrant_env.quadrant_expert)
        yield quadrant_env
    finally:
        unregister_env("quadrant")
        EXPERTS.remove("quadrant")
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop("quadrant_env", None)


@pytest.mark.train
def test_quadrant_learns(vlrl_train, quadrant_registered):
    run = vlrl_train(str(EXAMPLE / "quadrant.toml"))
    evals = {e["label"]: e["eval_reward_mean"] for e in run.record.phase("eval")}
    assert evals["before"] <= 0.3, f"the random init should be at or below chance, got {evals}"
    run.assert_learned(0.9)
    run.assert_images_mattered()  # the probe ran after SFT and at the end, and the answers moved with the image
    probes = {r["label"]: r for r in run.record.image_sensitivity}
    assert set(probes) == {"after_sft", "after"}, probes.keys()
    run.assert_agreement_held()
