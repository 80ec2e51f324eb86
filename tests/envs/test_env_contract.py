"""The contract types and the registry."""

from __future__ import annotations

import math

import pytest
import sample_envs as S

from vlrl.envs import (
    EnvError,
    EpisodeDoneError,
    StepResult,
    env_from_row,
    make_env,
    register_env,
    registered_envs,
    unregister_env,
)


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"observations": {}, "reward": 0.0, "done": False}, TypeError),
        ({"observations": [], "reward": "1", "done": False}, TypeError),
        ({"observations": [], "reward": True, "done": False}, TypeError),
        ({"observations": [], "reward": math.nan, "done": False}, ValueError),
        ({"observations": [], "reward": math.inf, "done": False}, ValueError),
        ({"observations": [], "reward": 0.0, "done": 1}, TypeError),
        ({"observations": [], "reward": 0.0, "done": False, "metadata": []}, TypeError),
    ],
)
def test_step_result_validates(kwargs, error):
    with pytest.raises(error):
        StepResult(**kwargs)


def test_step_result_is_frozen_and_coerces_int_reward():
    result = StepResult([], 1, True)
    assert isinstance(result.reward, float) and result.metadata == {}
    with pytest.raises(AttributeError):
        result.done = False  # type: ignore[misc]


def test_user_env_registers_like_ours():
    register_env("test/good", lambda extras, seed: S.GoodEnv(seed))
    try:
        assert "test/good" in registered_envs()
        with pytest.raises(EnvError, match="already registered"):
            register_env("test/good", lambda extras, seed: S.GoodEnv(seed))
        env = env_from_row(
            {"prompt": [{"role": "user", "content": "x"}], "env_class": "test/good", "extras": {}, "seed": 3}
        )
        assert env.seed == 3
    finally:
        unregister_env("test/good")
    assert "test/good" not in registered_envs()


def test_unknown_env_and_bad_rows_raise_clearly():
    with pytest.raises(EnvError, match="unknown env_class 'nope'.*maze2d/easy"):
        make_env("nope")
    with pytest.raises(EnvError, match="env_class"):
        env_from_row({"prompt": []})
    with pytest.raises(EnvError, match="action_mode"):
        make_env("maze2d/easy", {"action_mode": "telepathy"})


@pytest.mark.parametrize("name", ["maze2d/easy", "color_square", "geometry", "gym/FrozenLake-v1"])
def test_misuse_raises_specific_errors(name):
    env = make_env(name, {}, 0)
    with pytest.raises(EnvError, match="before init"):
        env.step("x")
    env.init(None)
    result = None
    for _ in range(env.max_turns):
        result = env.step("nonsense")
        if result.done:
            break
    assert result.done and result.observations == []
    with pytest.raises(EpisodeDoneError, match="after the episode ended"):
        env.step("again")
    env.close()
    env.close()
    with pytest.raises(EpisodeDoneError, match="after close"):
        env.step("x")


def test_unseeded_env_reports_its_seed_and_replays():
    env = make_env("maze2d/easy")
    messages, info = env.init(None)
    replay, _ = make_env("maze2d/easy", {}, info["seed"]).init(None)
    assert replay == messages


def test_envs_package_import_is_light():
    import subprocess
    import sys

    code = (
        "import sys, vlrl.envs; vlrl.envs.registered_envs(); "
        "bad = [m for m in ('torch', 'transformers', 'sympy', 'pygame') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
