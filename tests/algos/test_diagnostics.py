"""Learning diagnostics (vlrl.algos.diagnostics) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.algos import AlgoConfig, get_advantage_fn
from vlrl.algos.diagnostics import advantage_stats


def test_advantage_stats_of_grpo_hand_computed():
    # three groups of two: {1, 0} (signal), {1, 1} and {0, 0} (equal returns: GRPO gives them 0)
    returns = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    adv = get_advantage_fn("grpo")(returns, mask, groups, AlgoConfig())
    stats = advantage_stats(adv, mask, returns, groups)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group 0: mean 0.5, unbiased std sqrt(0.5)
    assert stats["adv_abs_mean"] == pytest.approx(3 * a / 12)  # 3 of 12 trained tokens are non-zero
    assert stats["adv_mean"] == pytest.approx((2 * a - a) / 12)
    assert stats["adv_zero_group_frac"] == pytest.approx(2 / 3)
    assert stats["reward_equal_group_frac"] == pytest.approx(2 / 3)
    assert stats["reward_group_std"] == pytest.approx(0.5 / 3)  # population std 0.5, 0, 0


def test_equal_returns_need_not_mean_zero_advantage():
    # reinforce_pp whitens over the batch and ignores groups: equal-return groups still get gradient,
    # which is why the two fractions are logged separately
    returns = torch.tensor([1.0, 1.0, 0.0, 0.0])
    groups = [0, 0, 1, 1]
    mask = torch.ones(4, 2)
    adv = get_advantage_fn("reinforce_pp")(returns, mask, groups, AlgoConfig())
    stats = advantage_stats(adv, mask, returns, groups)
    assert stats["reward_equal_group_frac"] == 1.0
    assert stats["adv_zero_group_frac"] == 0.0
    assert stats["adv_abs_mean"] > 0.9


def test_masked_tokens_do_not_count():
    adv = torch.tensor([[0.0, 5.0], [0.0, 0.0]])  # the 5 sits on a masked token
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    stats = advantage_stats(adv, mask, torch.tensor([1.0, 0.0]), [0, 0])
    assert stats["adv_abs_mean"] == 0.0 and stats["adv_zero_group_frac"] == 1.0
    assert stats["reward_equal_group_frac"] == 0.0


def test_trainer_param_groups_of_qwen_names():
    from vlrl.train.trainer import param_group

    assert param_group("model.visual.patch_embed.proj.weight") == "vision"
    assert param_group("model.visual.blocks.0.attn.qkv.weight") == "vision"
    assert param_group("model.visual.merger.mlp.0.weight") == "merger"
    assert param_group("model.visual.deepstack_merger_list.0.linear_fc1.weight") == "merger"
    assert param_group("model.language_model.embed_tokens.weight") == "embed"
    assert param_group("lm_head.weight") == "embed"
    assert param_group("model.language_model.layers.1.mlp.up_proj.weight") == "language"
    assert param_group("model.language_model.norm.weight") == "language"
