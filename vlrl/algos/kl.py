"""KL(pi || pi_ref) estimators from sampled tokens, and the two ways to use them.

Each estimator maps ``logprobs`` and ``ref_logprobs`` ``[B, T]`` (log-probs of the sampled
tokens under the policy and under a frozen reference) to a per-token estimate ``[B, T]``.
With ``d = clamp(logprobs - ref_logprobs, ±clamp)`` (the clamp keeps ``exp`` finite):

- ``k1 = d``                     unbiased, high variance, can be negative
- ``k2 = d**2 / 2``              biased, low variance, >= 0
- ``k3 = exp(-d) - 1 + d``       unbiased (``q/p - 1 - log(q/p)``), low variance, >= 0

(J. Schulman, "Approximating KL divergence", 2020.) Use them either as a loss term
(``kl_loss``, aggregated like the policy loss and added to it) or inside the reward
(``kl_penalized_rewards``, detached, before advantages are computed); not both
(``AlgoConfig.kl_in_reward`` picks one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from vlrl.algos.advantages import token_rewards
from vlrl.algos.masked import check_same_shape, safe_log_ratio, zero_masked
from vlrl.registry import Registry

if TYPE_CHECKING:
    from vlrl.algos.config import AlgoConfig


class KLEstimatorFn(Protocol):
    def __call__(self, logprobs: Tensor, ref_logprobs: Tensor, clamp: float = 20.0) -> Tensor: ...


KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry("KL estimator")
register_kl = KL_ESTIMATORS.register
get_kl_fn = KL_ESTIMATORS.get


@register_kl("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """``d = logprobs - ref_logprobs`` (clamped). ``[B, T]`` → ``[B, T]``."""
    return safe_log_ratio(logprobs, ref_logprobs, clamp)


@register_kl("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """``d**2 / 2``. ``[B, T]`` → ``[B, T]``."""
    return 0.5 * safe_log_ratio(logprobs, ref_logprobs, clamp).square()


@register_kl("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """``exp(-d) - 1 + d``. ``[B, T]`` → ``[B, T]``."""
    d = safe_log_ratio(logprobs, ref_logprobs, clamp)
    return torch.expm1(-d) + d


def kl_loss(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, cfg: AlgoConfig) -> Tensor:
    """Per-token KL loss term ``kl_coef * k(logprobs, ref_logprobs)``, 0 on masked tokens.

    Gradients flow through ``logprobs`` only (the reference is frozen). Aggregate it with the
    same aggregation as the policy loss and add. Shapes: ``[B, T]`` → ``[B, T]``.
    """
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, mask=mask)
    kl = get_kl_fn(cfg.kl_estimator)(logprobs, ref_logprobs.detach(), cfg.log_ratio_clamp)
    return zero_masked(cfg.kl_coef * kl, mask)


def kl_penalized_rewards(
    rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, cfg: AlgoConfig
) -> Tensor:
    """Per-token rewards with the KL penalty folded in: ``r_t - kl_coef * k_t`` (no gradient).

    A ``[B]`` reward is first placed on each row's last response token (``token_rewards``);
    ``[B, T]`` rewards are used as given. Feed the result to an advantage estimator (grpo and
    rloo sum it per sequence; reinforce_pp discounts it per token).
    Shapes: rewards ``[B]``/``[B, T]``, the rest ``[B, T]`` → ``[B, T]``.
    """
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, response_mask=response_mask)
    kl = get_kl_fn(cfg.kl_estimator)(logprobs.detach(), ref_logprobs.detach(), cfg.log_ratio_clamp)
    return token_rewards(rewards, response_mask) - zero_masked(cfg.kl_coef * kl, response_mask)
