"""KL estimators against hand-computed values, their expectations, and the two KL helpers."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.algos import AlgoConfig, get_kl_fn, kl_loss, kl_penalized_rewards

LOGP = torch.tensor([[-1.0, -2.0, -0.5]])
REF = torch.tensor([[-1.5, -1.0, -0.5]])
# d = logp - ref = [0.5, -1.0, 0.0]


def test_k1_hand_computed():
    torch.testing.assert_close(get_kl_fn("k1")(LOGP, REF), torch.tensor([[0.5, -1.0, 0.0]]))


def test_k2_hand_computed():
    # d^2 / 2 = [0.125, 0.5, 0]
    torch.testing.assert_close(get_kl_fn("k2")(LOGP, REF), torch.tensor([[0.125, 0.5, 0.0]]))


def test_k3_hand_computed():
    # exp(-d) - 1 + d: e^-0.5 - 0.5 = 0.1065307; e^1 - 2 = 0.7182818; 1 - 1 + 0 = 0
    expected = torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]])
    torch.testing.assert_close(get_kl_fn("k3")(LOGP, REF), expected)


def test_log_ratio_clamp_keeps_values_finite():
    lp, ref = torch.tensor([[0.0, -60.0]]), torch.tensor([[-30.0, 0.0]])  # d = +30, -60
    torch.testing.assert_close(get_kl_fn("k1")(lp, ref), torch.tensor([[20.0, -20.0]]))
    # k3 at d = -20: e^20 - 21, finite
    k3 = get_kl_fn("k3")(lp, ref)
    torch.testing.assert_close(k3, torch.tensor([[math.exp(-20) + 19.0, math.exp(20) - 21.0]]))
    assert get_kl_fn("k3")(lp, ref, clamp=5.0)[0, 1].item() == pytest.approx(math.exp(5) - 6, rel=1e-6)


def test_k1_and_k3_are_unbiased_k2_is_not():
    # exact expectation over a small vocabulary, tokens drawn from p: E_p[k] vs KL(p || q)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    kl = (p * (p / q).log()).sum()
    expect = {name: (p * get_kl_fn(name)(p.log(), q.log())).sum() for name in ("k1", "k2", "k3")}
    torch.testing.assert_close(expect["k1"], kl)
    torch.testing.assert_close(expect["k3"], kl)
    assert abs(expect["k2"] - kl) > 1e-3


@pytest.mark.parametrize("name", ["k2", "k3"])
def test_k2_k3_are_non_negative(name):
    torch.manual_seed(0)
    assert torch.all(get_kl_fn(name)(torch.randn(50, 50) * 5, torch.randn(50, 50) * 5) >= 0)


def test_kl_loss_scales_masks_and_differentiates_policy_only():
    logp = LOGP.clone().requires_grad_()
    ref = REF.clone().requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = kl_loss(logp, ref, mask, AlgoConfig(kl_estimator="k2", kl_coef=0.1))
    # 0.1 * [0.125, 0.5, (masked)] = [0.0125, 0.05, 0]
    torch.testing.assert_close(out, torch.tensor([[0.0125, 0.05, 0.0]]))
    out.sum().backward()
    # d(0.1 * d^2 / 2)/d logp = 0.1 * d = [0.05, -0.1, 0]; the frozen reference gets nothing
    torch.testing.assert_close(logp.grad, torch.tensor([[0.05, -0.1, 0.0]]))
    assert ref.grad is None


def test_kl_penalized_rewards_hand_computed():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -1.0, -0.6]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = kl_penalized_rewards(torch.tensor([1.0, 2.0]), logp, ref, mask, AlgoConfig(kl_estimator="k1", kl_coef=0.5))
    # k1 = d: row 0 [0.5, -1.0, (masked)]; row 1 [0.2, 0.0, -0.4]
    # reward on the last response token, minus 0.5 * d on each response token:
    # row 0: [0 - 0.25, 1 + 0.5, 0]; row 1: [0 - 0.1, 0 - 0, 2 + 0.2]
    torch.testing.assert_close(out, torch.tensor([[-0.25, 1.5, 0.0], [-0.1, 0.0, 2.2]]))
    assert not out.requires_grad


def test_kl_in_reward_feeds_grpo_through_the_sequence_sum():
    from vlrl.algos import get_advantage_fn

    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -2.0], [-1.0, -1.0]])  # row 0 drifted by d = 1 per token
    cfg = AlgoConfig(kl_estimator="k1", kl_coef=0.25, adv_norm_std=False)
    rewards = kl_penalized_rewards(torch.tensor([1.0, 1.0]), logp, ref, torch.ones(2, 2), cfg)
    adv = get_advantage_fn("grpo")(rewards, torch.ones(2, 2), [0, 0], cfg)
    # scores: row 0 = 1 - 0.25 * 2 = 0.5, row 1 = 1 -> mean 0.75 -> [-0.25, 0.25]
    torch.testing.assert_close(adv, torch.tensor([[-0.25, -0.25], [0.25, 0.25]]))
