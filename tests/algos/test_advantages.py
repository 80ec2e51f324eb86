"""Advantage estimators against hand-computed values, plus their properties."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.algos import AlgoConfig, get_advantage_fn
from vlrl.algos.advantages import discounted_returns, group_index, token_rewards

EPS = 1e-6
CFG = AlgoConfig(adv_eps=EPS)


def mask_of(lengths: list[int], T: int) -> torch.Tensor:
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()


def per_seq(adv: torch.Tensor) -> torch.Tensor:
    """The value on each row's first token (all response tokens of a row share it)."""
    return adv[:, 0]


# ---------------------------------------------------------------- grpo


def test_grpo_with_std_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    mask = mask_of([3, 2, 1, 3, 2], T=3)
    adv = get_advantage_fn("grpo")(rewards, mask, groups, CFG)
    # group 0 = {1, 0}: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = sqrt(0.5)
    a0 = 0.5 / (math.sqrt(0.5) + EPS)  # 0.70710...
    # group 1 = {1, 1}: std 0 -> 0 / (0 + eps) = 0; group 2 = {5}: size 1 -> 0
    expected = torch.tensor(
        [
            [a0, a0, a0],
            [-a0, -a0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)


def test_grpo_eps_is_added_to_std_not_variance():
    rewards, mask = torch.tensor([1.0, 0.0]), torch.ones(2, 1)
    adv = get_advantage_fn("grpo")(rewards, mask, [0, 0], AlgoConfig(adv_eps=0.5))
    # 0.5 / (sqrt(0.5) + 0.5) = 0.5 / 1.2071068 = 0.4142136; with var + eps it would be 0.5
    torch.testing.assert_close(per_seq(adv), torch.tensor([0.4142136, -0.4142136]))


def test_grpo_without_std_is_mean_centred_only():
    rewards = torch.tensor([3.0, 1.0, 2.0, 10.0])
    mask = torch.ones(4, 2)
    adv = get_advantage_fn("grpo")(rewards, mask, ["a", "a", "a", "b"], AlgoConfig(adv_norm_std=False))
    # group a = {3, 1, 2}: mean 2 -> [1, -1, 0]; group b = {10} -> 0
    torch.testing.assert_close(per_seq(adv), torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_grpo_interleaved_ids_tensor_and_list_agree():
    rewards = torch.tensor([1.0, 4.0, 0.0, 2.0])
    mask = torch.ones(4, 1)
    cfg = AlgoConfig(adv_norm_std=False)
    by_tensor = get_advantage_fn("grpo")(rewards, mask, torch.tensor([7, 3, 7, 3]), cfg)
    by_list = get_advantage_fn("grpo")(rewards, mask, ["p7", "p3", "p7", "p3"], cfg)
    # group 7 = {1, 0}: mean 0.5 -> [0.5, -0.5]; group 3 = {4, 2}: mean 3 -> [1, -1]
    expected = torch.tensor([0.5, 1.0, -0.5, -1.0])
    torch.testing.assert_close(per_seq(by_tensor), expected)
    torch.testing.assert_close(per_seq(by_list), expected)


def test_grpo_token_rewards_are_summed_over_the_response_mask():
    # per-token rewards; the 100 sits on a masked (observation) token and must be ignored
    rewards = torch.tensor([[0.5, 100.0, 0.5], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    adv = get_advantage_fn("grpo")(rewards, mask, [0, 0], AlgoConfig(adv_norm_std=False))
    # scores [1, 0], mean 0.5 -> [0.5, -0.5], zero on the masked token
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.0, 0.5], [-0.5, -0.5, -0.5]]))


def test_grpo_needs_group_ids_of_the_right_length():
    with pytest.raises(ValueError, match="group_ids"):
        get_advantage_fn("grpo")(torch.ones(2), torch.ones(2, 1), None, CFG)
    with pytest.raises(ValueError, match="3 entries for a batch of 2"):
        get_advantage_fn("grpo")(torch.ones(2), torch.ones(2, 1), [0, 0, 1], CFG)


def test_group_index_numbers_by_first_appearance():
    index, n = group_index(["b", "a", "b", "c"], 4, torch.device("cpu"))
    assert index.tolist() == [0, 1, 0, 2] and n == 3


# ---------------------------------------------------------------- rloo


def test_rloo_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0, 9.0])
    groups = [0, 0, 0, 1, 1, 2]
    adv = get_advantage_fn("rloo")(rewards, torch.ones(6, 2), groups, CFG)
    # group 0: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice)
    # group 1: 3 - 1 = 2; 1 - 3 = -2; group 2 has no other member -> 0
    torch.testing.assert_close(per_seq(adv), torch.tensor([1.0, -0.5, -0.5, 2.0, -2.0, 0.0]))


def test_rloo_is_n_over_n_minus_1_times_mean_centred():
    torch.manual_seed(0)
    rewards = torch.randn(8)
    groups = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])  # two groups of n = 4
    rloo = get_advantage_fn("rloo")(rewards, torch.ones(8, 1), groups, CFG)
    centred = get_advantage_fn("grpo")(rewards, torch.ones(8, 1), groups, AlgoConfig(adv_norm_std=False))
    torch.testing.assert_close(rloo, centred * 4 / 3)


# ---------------------------------------------------------------- reinforce++


def test_token_rewards_places_scalar_on_last_response_token():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    out = token_rewards(torch.tensor([2.0, 3.0, 7.0]), mask)
    # row 2 has no response tokens: its reward has nowhere to go
    torch.testing.assert_close(out, torch.tensor([[0.0, 2.0, 0, 0], [0, 0, 3.0, 0], [0, 0, 0, 0]]))


def test_discounted_returns_skip_masked_tokens():
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])  # token 1 is an environment observation
    r = torch.tensor([[1.0, 50.0, 0.0, 2.0]])  # the 50 on the observation is ignored
    # gamma 0.5: G3 = 2; G2 = 0 + 0.5*2 = 1; G1 masked -> 0; G0 = 1 + 0.5*G2 = 1.5
    torch.testing.assert_close(discounted_returns(r, mask, 0.5), torch.tensor([[1.5, 0.0, 1.0, 2.0]]))
    # gamma 1: sums of rewards at or after each response token: [3, 0, 2, 2]
    torch.testing.assert_close(discounted_returns(r, mask, 1.0), torch.tensor([[3.0, 0.0, 2.0, 2.0]]))


def test_discounted_returns_loop_matches_cumsum_path_as_gamma_tends_to_1():
    torch.manual_seed(1)
    r, mask = torch.randn(3, 6), (torch.rand(3, 6) > 0.3).float()
    torch.testing.assert_close(discounted_returns(r, mask, 1 - 1e-7), discounted_returns(r, mask, 1.0))


def test_reinforce_pp_gamma_1_hand_computed():
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = get_advantage_fn("reinforce_pp")(rewards, mask, None, CFG)
    # returns on the 5 response tokens: 1, 1 | 0, 0, 0 -> mean 0.4
    # unbiased var = (2 * 0.6^2 + 3 * 0.4^2) / 4 = 1.2 / 4 = 0.3
    std = math.sqrt(0.3) + EPS
    hi, lo = 0.6 / std, -0.4 / std  # 1.09545, -0.73030
    torch.testing.assert_close(adv, torch.tensor([[hi, hi, 0.0], [lo, lo, lo]]))


def test_reinforce_pp_discounted_hand_computed():
    rewards = torch.tensor([4.0])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv = get_advantage_fn("reinforce_pp")(rewards, mask, None, AlgoConfig(gamma=0.5, adv_eps=EPS))
    # reward 4 on the last token; returns 4, 2 (= 0.5*4), skip the masked token, 1 (= 0.5*2)
    # response returns {1, 2, 4}: mean 7/3, unbiased var = (16/9 + 1/9 + 25/9) / 2 = 7/3
    mean, std = 7 / 3, math.sqrt(7 / 3) + EPS
    expected = torch.tensor([[(1 - mean) / std, 0.0, (2 - mean) / std, (4 - mean) / std]])
    torch.testing.assert_close(adv, expected)


# ---------------------------------------------------------------- all estimators


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp"])
def test_masked_tokens_are_zero_and_no_gradient_needed(name):
    torch.manual_seed(2)
    rewards = torch.randn(6, requires_grad=True)
    mask = (torch.rand(6, 5) > 0.4).float()
    mask[:, 0] = 1.0
    adv = get_advantage_fn(name)(rewards, mask, [0, 0, 0, 1, 1, 1], CFG)
    assert adv.shape == (6, 5)
    assert torch.all(adv[mask == 0] == 0)
    assert torch.all(torch.isfinite(adv))
    assert adv[mask == 1].abs().sum() > 0  # not trivially zero


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_advantages_sum_to_zero_and_rank_like_rewards(name):
    rewards = torch.tensor([0.2, 0.9, 0.5, 3.0, -1.0, 0.0])
    adv = per_seq(get_advantage_fn(name)(rewards, torch.ones(6, 1), [0, 0, 0, 1, 1, 1], CFG))
    torch.testing.assert_close(adv[:3].sum(), torch.tensor(0.0))
    torch.testing.assert_close(adv[3:].sum(), torch.tensor(0.0))
    assert adv[:3].argsort().tolist() == rewards[:3].argsort().tolist()
    assert adv[3:].argsort().tolist() == rewards[3:].argsort().tolist()


def test_bad_reward_shape_is_refused():
    with pytest.raises(ValueError, match="rewards must be"):
        get_advantage_fn("grpo")(torch.ones(3), torch.ones(2, 4), [0, 0], CFG)
