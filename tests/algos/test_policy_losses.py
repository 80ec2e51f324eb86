"""Policy losses against hand-computed values and gradients, plus their properties."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.algos import AlgoConfig, get_aggregation_fn, get_policy_loss_fn

OLD = -1.0  # every old log-prob in the hand-computed cases; logprobs = OLD + log(ratio)


def from_ratios(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs with grad, old_logprobs) such that exp(logprobs - old) = ratios."""
    old = torch.full((len(ratios), len(ratios[0])), OLD)
    logprobs = (old + torch.tensor(ratios).log()).requires_grad_()
    return logprobs, old


# ---------------------------------------------------------------- ppo_clip

PPO_CFG = AlgoConfig(eps_clip_low=0.2, eps_clip_high=0.3, clip_ratio_c=3.0)
# token:        t0    t1    t2    t3    t4    t5 (masked)
PPO_RATIOS = [[1.5, 0.5, 0.5, 1.2, 5.0, 50.0]]
PPO_ADV = torch.tensor([[1.0, 1.0, -1.0, -2.0, -1.0, 1.0]])
PPO_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])


def test_ppo_clip_values_hand_computed():
    logprobs, old = from_ratios(PPO_RATIOS)
    loss, metrics = get_policy_loss_fn("ppo_clip")(logprobs, old, PPO_ADV, PPO_MASK, PPO_CFG)
    # clip range [0.8, 1.3]; L = max(-A r, -A clip(r))
    # t0: A=+1, r=1.5: max(-1.5, -1.3) = -1.3            (upper clip active)
    # t1: A=+1, r=0.5: max(-0.5, -0.8) = -0.5            (unclipped)
    # t2: A=-1, r=0.5: max( 0.5,  0.8) =  0.8            (lower clip active)
    # t3: A=-2, r=1.2: max( 2.4,  2.4) =  2.4            (inside the range)
    # t4: A=-1, r=5.0: max( 5.0,  1.3) =  5.0 -> dual clip min(5.0, -A*c = 3.0) = 3.0
    # t5: masked -> 0
    torch.testing.assert_close(loss, torch.tensor([[-1.3, -0.5, 0.8, 2.4, 3.0, 0.0]]))
    assert metrics["clipfrac"].item() == pytest.approx(2 / 5)  # t0, t2
    assert metrics["dual_clipfrac"].item() == pytest.approx(1 / 5)  # t4
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 0.5 + 1.2 + 5.0) / 5)
    kl = -sum(math.log(r) for r in PPO_RATIOS[0][:5]) / 5
    assert metrics["approx_kl"].item() == pytest.approx(kl, rel=1e-5)


def test_ppo_clip_gradient_hand_computed():
    logprobs, old = from_ratios(PPO_RATIOS)
    loss, _ = get_policy_loss_fn("ppo_clip")(logprobs, old, PPO_ADV, PPO_MASK, PPO_CFG)
    loss.sum().backward()
    # d(-A r)/d logp = -A r where unclipped; clipped, dual-clipped and masked tokens get 0
    # t1: -(+1)(0.5) = -0.5; t3: -(-2)(1.2) = 2.4
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.5, 0.0, 2.4, 0.0, 0.0]]))


def test_ppo_clip_without_dual_clip():
    logprobs, old = from_ratios(PPO_RATIOS)
    cfg = PPO_CFG.replace(clip_ratio_c=None)
    loss, metrics = get_policy_loss_fn("ppo_clip")(logprobs, old, PPO_ADV, PPO_MASK, cfg)
    assert loss[0, 4].item() == pytest.approx(5.0)  # -A r, no cap
    assert metrics["dual_clipfrac"].item() == 0.0


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    torch.manual_seed(0)
    log_ratio = torch.linspace(-8, 8, 401)[None, :]
    adv = -torch.rand(1, 401) * 5 - 0.01  # all negative
    ones = torch.ones(1, 401)
    loss, _ = get_policy_loss_fn("ppo_clip")(log_ratio, torch.zeros(1, 401), adv, ones, PPO_CFG)
    assert torch.all(loss <= -adv * 3.0 + 1e-6)
    unbounded, _ = get_policy_loss_fn("ppo_clip")(
        log_ratio, torch.zeros(1, 401), adv, ones, PPO_CFG.replace(clip_ratio_c=None)
    )
    assert torch.any(unbounded > -adv * 3.0)  # the bound is the dual clip's doing


def test_ppo_clip_gradient_direction():
    # on-policy (ratio 1): descending the loss raises log-probs of positive-advantage tokens
    logprobs = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    loss, _ = get_policy_loss_fn("ppo_clip")(logprobs, torch.zeros(1, 2), adv, torch.ones(1, 2), PPO_CFG)
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-2.0, 1.0]]))  # grad = -A at r = 1


# ---------------------------------------------------------------- gspo

GSPO_CFG = AlgoConfig(policy_loss="gspo", eps_clip_low=0.05, eps_clip_high=0.05)


def test_gspo_values_and_gradient_hand_computed():
    log_ratio = torch.tensor([[0.1, 0.3, -0.1, 9.0], [-0.02, 0.02, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0] * 4, [-0.5] * 4])
    old = torch.full((2, 4), OLD)
    logprobs = (old + log_ratio).requires_grad_()
    loss, metrics = get_policy_loss_fn("gspo")(logprobs, old, adv, mask, GSPO_CFG)
    # row 0: mean log-ratio over 3 tokens (0.1 + 0.3 - 0.1) / 3 = 0.1 (the masked 9.0 is ignored)
    #        s = e^0.1 = 1.10517 > 1.05 with A = +1: max(-1.10517, -1.05) = -1.05, clipped
    # row 1: mean log-ratio 0 -> s = 1, A = -0.5: loss 0.5 on each token, unclipped
    expected = torch.tensor([[-1.05, -1.05, -1.05, 0.0], [0.5, 0.5, 0.5, 0.5]])
    torch.testing.assert_close(loss, expected)
    assert metrics["clipfrac"].item() == pytest.approx(3 / 7)
    assert metrics["seq_ratio_mean"].item() == pytest.approx((math.exp(0.1) + 1.0) / 2)
    loss.sum().backward()
    # clipped row 0 -> no gradient; row 1: d(-A s_t)/d logp_t = -A s = 0.5 for every token
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0] * 4, [0.5] * 4]))


def test_gspo_token_form_credits_per_token_advantages():
    # GSPO-token: s_it has the value of s_i but gradient s_i * grad log pi_t, so per-token
    # advantages steer their own tokens. Row log-ratios 0.2, -0.2, 0 -> mean 0 -> s = 1.
    old = torch.zeros(1, 3)
    logprobs = torch.tensor([[0.2, -0.2, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    loss, _ = get_policy_loss_fn("gspo")(logprobs, old, adv, torch.ones(1, 3), GSPO_CFG)
    torch.testing.assert_close(loss, torch.tensor([[-1.0, 2.0, -0.5]]))  # -A_t * s
    loss.sum().backward()
    # dL_t/dlogp_t = -A_t * s = [-1, 2, -0.5]; a plain sequence ratio would give every token
    # -(sum_t A_t) * s / 3 = 0.1667 instead
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, 2.0, -0.5]]))


def test_gspo_equals_ppo_clip_when_all_tokens_share_one_ratio():
    torch.manual_seed(3)
    for shared in (-0.3, 0.0, 0.05, 0.4):
        old = torch.randn(3, 5)
        logprobs = (old + shared).requires_grad_()
        logprobs_ppo = (old + shared).requires_grad_()
        adv = torch.randn(3, 1).expand(3, 5)
        mask = torch.ones(3, 5)
        cfg = GSPO_CFG.replace(eps_clip_low=0.2, eps_clip_high=0.2, clip_ratio_c=None)
        g_loss, _ = get_policy_loss_fn("gspo")(logprobs, old, adv, mask, cfg)
        p_loss, _ = get_policy_loss_fn("ppo_clip")(logprobs_ppo, old, adv, mask, cfg)
        torch.testing.assert_close(g_loss, p_loss)
        g_loss.sum().backward()
        p_loss.sum().backward()
        torch.testing.assert_close(logprobs.grad, logprobs_ppo.grad)


def test_gspo_gradient_equals_the_sequence_objective():
    # GSPO's paper objective for one sequence (unclipped): -A * exp(mean_t (logp_t - old_t));
    # token form + seq_mean_token_mean must give the same gradient.
    torch.manual_seed(4)
    old = torch.randn(2, 6)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2])
    delta = 0.01 * torch.randn(2, 6)  # stays inside a wide clip range
    adv = torch.tensor([[0.7] * 6, [-1.3] * 6])
    cfg = GSPO_CFG.replace(eps_clip_low=0.5, eps_clip_high=0.5)
    lp_token = (old + delta).requires_grad_()
    loss, _ = get_policy_loss_fn("gspo")(lp_token, old, adv, mask, cfg)
    get_aggregation_fn("seq_mean_token_mean")(loss, mask).backward()
    lp_seq = (old + delta).requires_grad_()
    n = mask.sum(-1)
    s = torch.exp(((lp_seq - old) * mask).sum(-1) / n)
    (-(adv[:, 0] * s)).mean().backward()
    torch.testing.assert_close(lp_token.grad, lp_seq.grad)


# ---------------------------------------------------------------- cispo

CISPO_CFG = AlgoConfig(policy_loss="cispo", cispo_eps_low=1.0, cispo_eps_high=0.5)


def test_cispo_values_and_gradient_hand_computed():
    logprobs, old = from_ratios([[2.0, 0.5, 1.0]])
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = get_policy_loss_fn("cispo")(logprobs, old, adv, mask, CISPO_CFG)
    # weights clamp(r, 0, 1.5): t0 2.0 -> 1.5 (clipped), t1 0.5 stays; t2 masked
    lp0, lp1 = OLD + math.log(2.0), OLD + math.log(0.5)  # -0.30685, -1.69315
    # L = -w A logp: t0 -1.5 * 1 * lp0 = 0.46028; t1 -0.5 * (-2) * lp1 = -1.69315
    torch.testing.assert_close(loss, torch.tensor([[-1.5 * lp0, 1.0 * lp1, 0.0]]).detach())
    assert metrics["clipfrac"].item() == pytest.approx(1 / 2)
    loss.sum().backward()
    # the weight is a constant: dL/dlogp = -w A exactly (t0 -1.5, t1 +1.0)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.5, 1.0, 0.0]]))


def test_cispo_lower_clamp_and_no_token_loses_its_gradient():
    logprobs, old = from_ratios([[0.5, 100.0]])
    cfg = CISPO_CFG.replace(cispo_eps_low=0.2)  # weight range [0.8, 1.5]
    loss, _ = get_policy_loss_fn("cispo")(logprobs, old, torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), cfg)
    loss.sum().backward()
    # t0 weight 0.5 -> 0.8; t1 weight 100 -> 1.5; PPO would zero t1's gradient, CISPO keeps it
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.8, -1.5]]))


# ---------------------------------------------------------------- all losses


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_masked_tokens_contribute_nothing(name):
    torch.manual_seed(5)
    old = torch.randn(3, 5)
    lp = old + 0.1 * torch.randn(3, 5)
    adv = torch.randn(3, 5)
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 0, 1]])
    cfg = AlgoConfig(policy_loss=name)
    base = lp.clone().requires_grad_()
    loss, _ = get_policy_loss_fn(name)(base, old, adv, mask, cfg)
    loss.sum().backward()
    # change everything on masked tokens, including -inf log-probs (padding)
    lp2 = torch.where(mask.bool(), lp, torch.tensor(float("-inf"))).requires_grad_()
    old2 = torch.where(mask.bool(), old, torch.tensor(7.0))
    adv2 = torch.where(mask.bool(), adv, torch.tensor(1e3))
    loss2, _ = get_policy_loss_fn(name)(lp2, old2, adv2, mask, cfg)
    loss2.sum().backward()
    assert torch.all(loss[mask == 0] == 0) and torch.all(loss2[mask == 0] == 0)
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(lp2.grad, base.grad)
    assert torch.all(base.grad[mask == 0] == 0)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_on_policy_gradient_is_minus_advantage_times_score(name):
    # at ratio 1 every loss has gradient -A * grad log pi per token (cispo: its log-prob term)
    logprobs = torch.full((1, 3), -0.7, requires_grad=True)
    adv = torch.tensor([[1.5, 1.5, 1.5]])
    loss, _ = get_policy_loss_fn(name)(logprobs, logprobs.detach(), adv, torch.ones(1, 3), AlgoConfig())
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.full((1, 3), -1.5))


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="shape mismatch"):
        get_policy_loss_fn("ppo_clip")(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), AlgoConfig()
        )
