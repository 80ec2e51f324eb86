"""The training loop's own guarantees, on a few tiny steps: exact resume, every parameter trained,
agreement checked every step, the weight sync verified, config errors caught early."""

from __future__ import annotations

import pytest

from vlrl.checks.training import RunRecord
from vlrl.train.config import load_config
from vlrl.train.loop import train

TINY = (
    "sft.steps=2",
    "sft.rows_per_step=4",
    "rollout.rows_per_step=4",
    "rollout.repeats=2",
    "data.eval_rows=4",
    "data.train_rows=16",
    "run.eval_every=0",
    "run.samples=1",
    "run.progress=False",
)


def rl_lines(run_dir):
    return RunRecord.load(run_dir).phase("rl")


def test_resume_from_a_mid_run_checkpoint_reproduces_the_next_steps(tmp_path):
    # KL to the (pre-SFT) reference gives every RL step a gradient even where all rewards are 0, so
    # the steps after the checkpoint depend on the restored weights *and* optimizer state.
    common = [*TINY, "run.steps=3", "algo.kl_coef=0.05"]
    full = load_config("color_square", [*common, "run.checkpoint_every=1", f"run.out={tmp_path / 'a'}"])
    train(full)
    resumed = load_config(
        "color_square",
        [*common, f"run.out={tmp_path / 'b'}", f"run.resume={tmp_path / 'a' / 'checkpoints' / 'step_000001'}"],
    )
    train(resumed)
    a, b = rl_lines(tmp_path / "a"), rl_lines(tmp_path / "b")
    assert [m["step"] for m in b] == [2, 3]
    assert all(m["grad_norm"] > 0 for m in a), "the steps must train, or resuming proves nothing"
    for key in ("loss", "reward_mean", "grad_norm", "entropy"):
        assert [m[key] for m in a[1:]] == [m[key] for m in b], key


def test_a_run_changes_every_parameter_and_checks_agreement_every_step(vlrl_train):
    run = vlrl_train("color_square", *TINY, "run.steps=2")
    run.assert_all_parameters_changed()
    run.assert_agreement_held()
    assert len(run.record.agreement) == 2 and all(a["max_abs"] <= 1e-4 for a in run.record.agreement)
    # the recipe asks the engine for its top-5: the full-distribution check ran at every step too
    assert all(a["distribution"]["k"] == 5 and a["distribution"]["vocab_kl_max"] <= 1e-6 for a in run.record.agreement)
    assert [e["label"] for e in run.record.phase("eval")] == ["before", "after_sft", "after"]
    # every RL step's time split: rollout, train, sync (the sync is verified, so never free)
    assert all(m[f"time_{k}_s"] > 0 for m in run.record.phase("rl") for k in ("rollout", "train", "sync"))


def test_all_parameters_changed_fails_on_a_frozen_parameter(vlrl_train):
    run = vlrl_train("color_square", *TINY, "run.steps=1", "sft.steps=0")
    name = next(iter(run._initial))
    run._final.get_parameter(name).data.copy_(run._initial[name])
    with pytest.raises(AssertionError, match="never changed"):
        run.assert_all_parameters_changed()


def test_weight_sync_is_verified(tmp_path, monkeypatch):
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.train.run import WeightSyncError

    monkeypatch.setattr(EmbeddedEngine, "update_weights", lambda self, named, version=None: version)  # drops them
    cfg = load_config("color_square", [*TINY, "run.steps=1", f"run.out={tmp_path}"])
    with pytest.raises(WeightSyncError, match="checksum"):
        train(cfg)


def test_stop_at_ends_rl_at_the_first_evaluation_that_reaches_it(vlrl_train):
    # every reward is >= -1: the first evaluation (after step 2 of 6) ends RL; the final evaluation and the
    # summary name the steps that ran
    run = vlrl_train("color_square", *TINY, "sft.steps=0", "run.steps=6", "run.eval_every=2", "run.stop_at=-1")
    assert [m["step"] for m in run.record.phase("rl")] == [1, 2]
    evals = run.record.phase("eval")
    assert [(e["label"], e["step"]) for e in evals] == [("before", 0), ("during", 2), ("after", 2)]
    assert run.summary["steps"] == 2


@pytest.mark.parametrize(
    "override, message",
    [
        ("run.stop_at=soon", "run.stop_at"),
        ("algo.advantage=grpoo", "grpoo"),
        ("rollout.max_tokens=many", "rollout.max_tokens"),
        ("optim.nope=1", "unknown key"),
        ("model=1", "section.key=value"),
    ],
)
def test_bad_config_fails_before_anything_runs(override, message):
    with pytest.raises(ValueError, match=message):
        load_config("color_square", [override])
