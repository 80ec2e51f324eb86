"""AlgoConfig: validation, immutability, help text written once."""

from __future__ import annotations

import dataclasses

import pytest

from vlrl.algos import AlgoConfig
from vlrl.algos.config import attribute_docs
from vlrl.registry import UnknownNameError


def test_defaults_are_valid_and_frozen():
    cfg = AlgoConfig()
    assert (cfg.advantage, cfg.policy_loss, cfg.loss_agg, cfg.kl_estimator) == ("grpo", "ppo_clip", "token_mean", "k3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kl_coef = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "listed"),
    [
        ("advantage", "gae", "grpo, reinforce_pp, rloo"),
        ("policy_loss", "ppo", "cispo, gspo, ppo_clip"),
        ("loss_agg", "mean", "seq_mean_token_mean"),
        ("kl_estimator", "abs", "k1, k2, k3"),
        ("correction_level", "geo", "sequence, token"),
        ("correction_mode", "clip", "mask, truncate"),
    ],
)
def test_unknown_names_fail_at_construction(field, value, listed):
    with pytest.raises(UnknownNameError, match=listed):
        AlgoConfig(**{field: value})


@pytest.mark.parametrize(
    "bad",
    [
        {"eps_clip_low": -0.1},
        {"eps_clip_low": 1.0},
        {"clip_ratio_c": 1.0},
        {"adv_eps": 0.0},
        {"gamma": 1.5},
        {"kl_coef": -1.0},
        {"correction_cap": 0.0},
        {"correction_low": 2.0, "correction_high": 1.0},
        {"loss_agg": "seq_mean_token_sum_norm"},
        {"cispo_eps_high": -1.0},
        {"log_ratio_clamp": 0.0},
    ],
)
def test_out_of_range_values_are_refused(bad):
    with pytest.raises(ValueError, match="AlgoConfig"):
        AlgoConfig(**bad)


def test_replace_validates_again():
    cfg = AlgoConfig().replace(loss_agg="seq_mean_token_sum_norm", loss_norm_len=512)
    assert cfg.loss_norm_len == 512
    with pytest.raises(ValueError):
        cfg.replace(loss_norm_len=None)


def test_every_field_has_help_text():
    docs = attribute_docs(AlgoConfig)
    fields = [f.name for f in dataclasses.fields(AlgoConfig)]
    assert list(docs) == fields
    assert all(len(text) > 10 for text in docs.values())
    assert "discount" in docs["gamma"]
