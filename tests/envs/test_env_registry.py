"""One registry idea: envs and SFT experts go through ``vlrl.registry.Registry`` (as the algorithm
families do), each expert lives beside its env, and ``expert_for`` keeps serving the training loop."""

from __future__ import annotations

import pytest

import vlrl.algos
import vlrl.train.experts
from vlrl.envs import EnvError, expert_for, make_env, register_expert, registered_experts
from vlrl.envs.registry import ENVS, EXPERTS
from vlrl.registry import Registry, UnknownNameError


def play(env_class: str, expert: str, seed: int, extras: dict | None = None) -> tuple[float, int]:
    """Run an expert's replies through the env; (return, turns)."""
    row = {"env_class": env_class, "extras": extras or {}, "seed": seed}
    env = make_env(env_class, row["extras"], seed)
    env.init(None)
    total, turns = 0.0, 0
    for reply in expert_for(expert)(env, row):
        result = env.step(reply)
        total, turns = total + result.reward, turns + 1
        if result.done:
            break
    return total, turns


def test_one_registry_class_for_algos_envs_and_experts():
    assert all(
        isinstance(reg, Registry) for reg in (vlrl.algos.ADVANTAGES, vlrl.algos.POLICY_LOSSES, vlrl.algos.KL_ESTIMATORS)
    )
    assert isinstance(ENVS, Registry) and isinstance(EXPERTS, Registry)
    assert vlrl.train.experts.expert_for is expert_for  # what vlrl.train.loop imports
    assert {"maze2d", "color_square", "color_square/format"} <= set(registered_experts())


@pytest.mark.parametrize("level", ["5x5", "7x7", "easy", "hard"])
def test_the_maze2d_expert_solves_every_level(level):
    for seed in range(3):
        total, _ = play(f"maze2d/{level}", "maze2d", seed)
        assert total > 0, (level, seed)
    total, _ = play(f"maze2d/{level}", "maze2d", 0, {"action_mode": "tuple"})  # the row's action format
    assert total > 0


def test_color_square_experts():
    assert [play("color_square", "color_square", s, {"n_turns": 3}) for s in range(4)] == [(1.0, 3)] * 4
    env = make_env("color_square", {"n_turns": 5}, 7)
    env.init(None)
    row = {"seed": 7}
    a, b = list(expert_for("color_square/format")(env, row)), list(expert_for("color_square/format")(env, row))
    assert a == b and len(a) == 5 and set(a) <= set(env.gym_env.unwrapped.names)  # seeded by the row


def test_unknown_and_duplicate_experts_are_refused():
    with pytest.raises(UnknownNameError, match="unknown expert 'nope'; valid names: .*maze2d"):
        expert_for("nope")
    with pytest.raises(EnvError, match="already registered"):
        register_expert("maze2d", lambda env, row: iter(()))
    with pytest.raises(EnvError, match="not callable"):
        register_expert("mine", "not a function")
    register_expert("test/mine", lambda env, row: iter(["x"]))
    try:
        assert list(expert_for("test/mine")(None, {})) == ["x"]
    finally:
        EXPERTS.remove("test/mine")
