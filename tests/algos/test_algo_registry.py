"""The registry mechanism and the names registered in each family."""

from __future__ import annotations

import pytest

from vlrl.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTION_LEVELS,
    CORRECTION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    get_advantage_fn,
    get_aggregation_fn,
    get_kl_fn,
    get_policy_loss_fn,
    register_advantage,
)
from vlrl.registry import DuplicateNameError, Registry, UnknownNameError


def test_duplicate_name_raises_and_keeps_the_first():
    reg: Registry = Registry("widget")

    @reg.register("a")
    def first():  # pragma: no cover - never called
        return 1

    with pytest.raises(DuplicateNameError, match="widget 'a' is already registered"):

        @reg.register("a")
        def second():  # pragma: no cover
            return 2

    assert reg.get("a") is first and len(reg) == 1


def test_unknown_name_lists_valid_names():
    reg: Registry = Registry("widget")
    reg.register("beta")(lambda: None)
    reg.register("alpha")(lambda: None)
    with pytest.raises(UnknownNameError) as err:
        reg.get("gamma")
    assert str(err.value) == "unknown widget 'gamma'; valid names: alpha, beta"
    assert isinstance(err.value, KeyError)


def test_empty_registry_says_so():
    with pytest.raises(UnknownNameError, match=r"\(none registered\)"):
        Registry("widget").get("x")


def test_builtin_registry_refuses_to_overwrite():
    original = get_advantage_fn("grpo")
    with pytest.raises(DuplicateNameError):
        register_advantage("grpo")(lambda *a: None)
    assert get_advantage_fn("grpo") is original


@pytest.mark.parametrize(
    ("getter", "bad", "listed"),
    [
        (get_advantage_fn, "ppo", "grpo, reinforce_pp, rloo"),
        (get_policy_loss_fn, "ppo", "cispo, gspo, ppo_clip"),
        (get_aggregation_fn, "mean", "seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"),
        (get_kl_fn, "k4", "k1, k2, k3"),
    ],
)
def test_getters_list_valid_names(getter, bad, listed):
    with pytest.raises(UnknownNameError, match=f"valid names: {listed}$"):
        getter(bad)


def test_registered_names_are_exactly_the_tested_ones():
    # a new registration must come with hand-computed tests; update this list when adding them
    assert ADVANTAGES.names() == ("grpo", "reinforce_pp", "rloo")
    assert POLICY_LOSSES.names() == ("cispo", "gspo", "ppo_clip")
    assert AGGREGATIONS.names() == ("seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean")
    assert KL_ESTIMATORS.names() == ("k1", "k2", "k3")
    assert CORRECTION_LEVELS.names() == ("sequence", "token")
    assert CORRECTION_MODES.names() == ("mask", "truncate")
