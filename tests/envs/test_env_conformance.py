"""The conformance suite: every registered env passes it, and it catches broken envs."""

from __future__ import annotations

from pathlib import Path

import pytest
import sample_envs as S  # tests/envs is on sys.path (rootdir-relative test module import)

from pytest_vlrl.envs import parametrize_envs
from vlrl.checks.envs import EnvConformanceError, check_env
from vlrl.cli import main as vlrl_main
from vlrl.envs import registered_envs

BUILTINS = {
    "maze2d/5x5",
    "maze2d/7x7",
    "maze2d/easy",
    "maze2d/hard",
    "color_square",
    "geometry",
    "gym/FrozenLake-v1",
    "gym/CliffWalking-v1",
    "gym/Taxi-v4",
}


def test_all_builtins_are_registered():
    assert BUILTINS <= set(registered_envs())


def test_every_registered_env_conforms(vlrl_env_name, vlrl_check_env):
    report = vlrl_check_env(vlrl_env_name, n_hostile=30)
    assert report.ok and report.n_steps > report.n_hostile


@parametrize_envs("maze2d/easy", "color_square")
def test_parametrize_envs_helper(vlrl_env_name):
    assert vlrl_env_name in ("maze2d/easy", "color_square")


def test_good_sample_env_passes():
    assert check_env(S.make_good, n_hostile=10).ok


@pytest.mark.parametrize(
    "cls,check",
    [
        (S.EvalEnv, "no_execution"),
        (S.NondeterministicEnv, "determinism"),
        (S.NoDoneErrorEnv, "step_after_done"),
        (S.ObsAfterDoneEnv, "done"),
        (S.CrashOnHostileEnv, "hostile"),
        (S.HugeImageEnv, "images"),
        (S.BadMessagesEnv, "messages"),
        (S.NeverDoneEnv, "done"),
    ],
)
def test_broken_envs_are_caught(cls, check):
    report = check_env(cls, n_hostile=10, raise_on_failure=False)
    assert not report.ok
    assert check in {f.check for f in report.failures}, report.summary()
    with pytest.raises(EnvConformanceError, match=rf"\[{check}\]"):
        check_env(cls, n_hostile=0)


def test_eval_env_canary_payload_leaves_a_trace_that_is_reported():
    report = check_env(S.EvalEnv, n_hostile=0, raise_on_failure=False)
    details = " ".join(f.detail for f in report.failures if f.check == "no_execution")
    assert "exec of code compiled from a string" in details
    canary = " ".join(f.detail for f in report.failures if f.check == "canary")
    assert "builtins.vlrl_canary_flag was set" in canary  # the payload really ran inside the broken env
    import builtins

    if hasattr(builtins, "vlrl_canary_flag"):
        delattr(builtins, "vlrl_canary_flag")


def test_fixture_fails_the_test_with_a_readable_list():
    from _pytest.outcomes import Failed

    from pytest_vlrl.envs import vlrl_check_env

    check = vlrl_check_env.__wrapped__()
    with pytest.raises(Failed, match=r"FAIL .*\n  \[determinism\]"):
        check(S.NondeterministicEnv, n_hostile=0)


def test_check_env_cli(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    assert vlrl_main(["check-env", "sample_envs:make_good", "--n-hostile", "5"]) == 0
    assert "sample_envs:make_good: PASS" in capsys.readouterr().out
    assert vlrl_main(["check-env", "sample_envs:NondeterministicEnv", "--n-hostile", "0"]) == 1
    assert "[determinism]" in capsys.readouterr().out
    assert vlrl_main(["check-env", "color_square", "--n-hostile", "0"]) == 0
    assert vlrl_main(["check-env", "no_such_module_xyz:make"]) == 2
