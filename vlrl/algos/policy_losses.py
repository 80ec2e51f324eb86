"""Policy-gradient surrogate losses, per token. Aggregation is separate (``aggregation.py``).

Every loss has the signature::

    fn(logprobs, old_logprobs, advantages, mask, cfg) -> (loss, metrics)

- ``logprobs``: ``[B, T]`` log-probs of the taken tokens under the current policy (with grad).
- ``old_logprobs``: ``[B, T]`` the same under the policy that the batch is trained against
  (the trainer's recompute at rollout time); treated as constants.
- ``advantages``: ``[B, T]``; constants.
- ``mask``: ``[B, T]`` 1 on trained tokens.
- returns ``loss`` ``[B, T]`` (exactly 0 on masked tokens, whatever finite or ±inf padding
  they hold; *minimise* it) and ``metrics``: detached
  0-dim tensors averaged over the unmasked tokens of this call (``.item()`` them when logging).

The importance ratio is ``r = exp(clamp(logprobs - old_logprobs, ±cfg.log_ratio_clamp))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vlrl.algos.masked import check_same_shape, masked_mean, safe_log_ratio, zero_masked
from vlrl.registry import Registry

if TYPE_CHECKING:
    from vlrl.algos.config import AlgoConfig

Metrics = dict[str, Tensor]
PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, "AlgoConfig"], tuple[Tensor, Metrics]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss_fn = POLICY_LOSSES.get


def _prepare(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Check shapes; return ``logprobs``, constant ``old_logprobs`` and ``advantages``, float mask.

    All three are zeroed on masked tokens (``torch.where``), so padding such as ``-inf`` there
    can produce neither NaN values nor NaN gradients downstream.
    """
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    m = mask.to(logprobs.dtype)
    return zero_masked(logprobs, m), zero_masked(old_logprobs.detach(), m), zero_masked(advantages.detach(), m), m


def _clip_surrogate(ratio: Tensor, adv: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic surrogate ``max(-A r, -A clip(r, low, high))`` and where clipping won."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(low, high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig
) -> tuple[Tensor, Metrics]:
    """PPO clipped surrogate with asymmetric clip range and optional dual clip.

    ``L = max(-A r, -A clip(r, 1 - eps_clip_low, 1 + eps_clip_high))``. Dual clip (when
    ``cfg.clip_ratio_c`` is set, value ``c > 1``): for tokens with ``A < 0`` the loss is
    further capped, ``L = min(L, -A c)``, so a huge ratio on a bad token cannot blow up.
    Metrics: ``clipfrac`` (the clip bound was active), ``dual_clipfrac``, ``ratio_mean``,
    ``approx_kl`` (mean of ``old - new`` log-probs, k1 of old vs new).
    Shapes: all inputs ``[B, T]`` → loss ``[B, T]``.
    """
    logprobs, old, adv, m = _prepare(logprobs, old_logprobs, advantages, mask)
    log_ratio = safe_log_ratio(logprobs, old, cfg.log_ratio_clamp)
    ratio = log_ratio.exp()
    loss, clip_active = _clip_surrogate(ratio, adv, 1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    dual_active = torch.zeros_like(clip_active)
    if cfg.clip_ratio_c is not None:
        cap = -adv * cfg.clip_ratio_c
        dual_active = (adv < 0) & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    metrics = {
        "clipfrac": masked_mean(clip_active.to(m.dtype), m).detach(),
        "dual_clipfrac": masked_mean(dual_active.to(m.dtype), m).detach(),
        "ratio_mean": masked_mean(ratio, m).detach(),
        "approx_kl": masked_mean(-log_ratio, m).detach(),
    }
    return zero_masked(loss, m), metrics


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clamp: float) -> Tensor:
    """GSPO's sequence log-ratio ``[B]``: mean over the row's unmasked tokens of ``logp - old``.

    Clamped to ``±clamp``. Rows without unmasked tokens get 0.
    """
    return masked_mean(logprobs - old_logprobs, mask, dim=-1).clamp(-clamp, clamp)


@register_policy_loss("gspo")
def gspo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig
) -> tuple[Tensor, Metrics]:
    """GSPO: PPO clipping applied to the sequence-level ratio ``s_i = exp(mean_t log r_it)``.

    Token form (as in the GSPO paper's GSPO-token): ``s_it = sg(s_i) * pi_t / sg(pi_t)``, whose
    value is ``s_i`` on every token of row i and whose gradient is ``s_i * grad log pi_t``;
    ``L_it = max(-A_it s_it, -A_it clip(s_it, 1 - eps_clip_low, 1 + eps_clip_high))``.
    With per-sequence advantages and ``seq_mean_token_mean`` aggregation this is exactly the
    paper's sequence objective. No dual clip. GSPO's paper uses eps of 3e-4 / 4e-4.
    Metrics: ``clipfrac`` (over tokens), ``seq_ratio_mean`` (over rows with tokens).
    Shapes: all inputs ``[B, T]`` → loss ``[B, T]``.
    """
    logprobs, old, adv, m = _prepare(logprobs, old_logprobs, advantages, mask)
    seq_log_ratio = sequence_log_ratio(logprobs, old, m, cfg.log_ratio_clamp)  # [B]
    token_log_ratio = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()
    ratio = token_log_ratio.exp()
    loss, clip_active = _clip_surrogate(ratio, adv, 1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high)
    has_tokens = (m.sum(-1) > 0).to(m.dtype)
    metrics = {
        "clipfrac": masked_mean(clip_active.to(m.dtype), m).detach(),
        "seq_ratio_mean": masked_mean(seq_log_ratio.exp(), has_tokens).detach(),
    }
    return zero_masked(loss, m), metrics


@register_policy_loss("cispo")
def cispo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgoConfig
) -> tuple[Tensor, Metrics]:
    """CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient importance weight.

    ``L_t = -sg(clip(r_t, 1 - cispo_eps_low, 1 + cispo_eps_high)) * A_t * logprobs_t``.
    Unlike PPO no token loses its gradient: the weight is clipped, the log-prob is not.
    Its value is not a ratio objective (it contains ``logprobs``); only its gradient
    ``-w_t A_t grad log pi_t`` matters.
    Metrics: ``clipfrac`` (weight was clamped), ``ratio_mean``.
    Shapes: all inputs ``[B, T]`` → loss ``[B, T]``.
    """
    logprobs, old, adv, m = _prepare(logprobs, old_logprobs, advantages, mask)
    ratio = safe_log_ratio(logprobs.detach(), old, cfg.log_ratio_clamp).exp()
    weight = ratio.clamp(1.0 - cfg.cispo_eps_low, 1.0 + cfg.cispo_eps_high)
    loss = -weight * adv * logprobs
    metrics = {
        "clipfrac": masked_mean((weight != ratio).to(m.dtype), m).detach(),
        "ratio_mean": masked_mean(ratio, m).detach(),
    }
    return zero_masked(loss, m), metrics
