"""Rollout-mismatch correction: importance weights between trainer and inference engine.

The engine samples with its own numerics, so the probability it gave a token
(``rollout_logprobs``) differs from what the trainer computes for the same weights
(``old_logprobs``). Truncated importance sampling reweights each trained unit by
``w = pi_old / pi_rollout`` so that the gradient estimates the trainer's policy:

- *level* (``CORRECTION_LEVELS``): ``token`` gives each token its own ``w_t = exp(d_t)`` with
  ``d_t = old_t - rollout_t``; ``sequence`` gives every token of a row the product ratio
  ``w = exp(sum_t d_t)`` over the row's unmasked tokens. Log-ratios are clamped to
  ``±cfg.log_ratio_clamp`` (per token, then the sequence sum) before ``exp``.
- *mode* (``CORRECTION_MODES``): ``truncate`` caps weights, ``w' = min(w, cfg.correction_cap)``
  (TIS); ``mask`` keeps ``w`` where ``correction_low <= w <= correction_high`` and sets 0
  elsewhere (masked IS: the unit drops out of the gradient).

Multiply the per-token policy loss by the weights before aggregation. Weights carry no
gradient. Metrics are over *units* (unmasked tokens, or rows with unmasked tokens):
``ratio_mean/max/min`` of the raw ``w``, ``frac_clipped`` or ``frac_masked``, ``ess``
(normalised effective sample size of the final weights, ``(sum w')^2 / (n sum w'^2)``, 1 when
all are equal, 0 when all are masked) and ``logprob_abs_diff_mean`` (mean ``|d_t|`` over tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vlrl.algos.masked import (
    check_same_shape,
    masked_max,
    masked_mean,
    masked_min,
    masked_sum,
    safe_log_ratio,
    zero_masked,
)
from vlrl.registry import Registry

if TYPE_CHECKING:
    from vlrl.algos.config import AlgoConfig

Metrics = dict[str, Tensor]
# (old_logprobs [B,T], rollout_logprobs [B,T], mask [B,T], clamp) -> (log w [B,U], unit mask [B,U])
LevelFn = Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
# (w [B,U], unit mask [B,U], cfg) -> (w' [B,U], metrics)
ModeFn = Callable[[Tensor, Tensor, "AlgoConfig"], tuple[Tensor, Metrics]]

CORRECTION_LEVELS: Registry[LevelFn] = Registry("correction level")
CORRECTION_MODES: Registry[ModeFn] = Registry("correction mode")


@CORRECTION_LEVELS.register("token")
def token_level(old: Tensor, rollout: Tensor, mask: Tensor, clamp: float) -> tuple[Tensor, Tensor]:
    """One unit per token: log-weights ``[B, T]`` and the token mask ``[B, T]``."""
    return safe_log_ratio(old, rollout, clamp), mask.bool()


@CORRECTION_LEVELS.register("sequence")
def sequence_level(old: Tensor, rollout: Tensor, mask: Tensor, clamp: float) -> tuple[Tensor, Tensor]:
    """One unit per row: summed log-weights ``[B, 1]`` and ``[B, 1]`` "row has tokens"."""
    log_w = masked_sum(safe_log_ratio(old, rollout, clamp), mask, dim=-1).clamp(-clamp, clamp)
    return log_w[:, None], mask.bool().any(dim=-1, keepdim=True)


@CORRECTION_MODES.register("truncate")
def truncate_mode(w: Tensor, units: Tensor, cfg: AlgoConfig) -> tuple[Tensor, Metrics]:
    """``min(w, cfg.correction_cap)``; metric ``frac_clipped``: units whose weight was capped."""
    clipped = w > cfg.correction_cap
    frac = masked_mean(clipped.to(w.dtype), units)
    return w.clamp(max=cfg.correction_cap), {"frac_clipped": frac}


@CORRECTION_MODES.register("mask")
def mask_mode(w: Tensor, units: Tensor, cfg: AlgoConfig) -> tuple[Tensor, Metrics]:
    """``w`` inside ``[correction_low, correction_high]``, else 0; metric ``frac_masked``."""
    keep = (w >= cfg.correction_low) & (w <= cfg.correction_high)
    frac = masked_mean((~keep).to(w.dtype), units)
    return w * keep.to(w.dtype), {"frac_masked": frac}


def effective_sample_size(w: Tensor, units: Tensor) -> Tensor:
    """Normalised ESS ``(sum w)^2 / (n sum w^2)`` over the ``n`` units; 0 if every ``w`` is 0."""
    n = units.to(w.dtype).sum()
    sum_sq = masked_sum(w.square(), units)
    ess = masked_sum(w, units).square() / (n * sum_sq).clamp(min=torch.finfo(w.dtype).tiny)
    return torch.where(sum_sq > 0, ess, torch.zeros_like(ess))


def rollout_correction(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cfg: AlgoConfig
) -> tuple[Tensor, Metrics]:
    """Importance weights ``[B, T]`` (0 on masked tokens) and metrics; see the module docstring.

    ``cfg.correction_level=None`` turns correction off: weights are the mask (1 on unmasked
    tokens) and only ``logprob_abs_diff_mean`` is reported.
    Shapes: ``old_logprobs``, ``rollout_logprobs``, ``mask`` ``[B, T]`` → ``[B, T]``.
    """
    check_same_shape(old_logprobs=old_logprobs, rollout_logprobs=rollout_logprobs, mask=mask)
    old, rollout = old_logprobs.detach().float(), rollout_logprobs.detach().float()
    diff = masked_mean((old - rollout).abs(), mask)
    if cfg.correction_level is None:
        return mask.to(old.dtype), {"logprob_abs_diff_mean": diff}
    log_w, units = CORRECTION_LEVELS.get(cfg.correction_level)(old, rollout, mask, cfg.log_ratio_clamp)
    w = log_w.exp()
    final, metrics = CORRECTION_MODES.get(cfg.correction_mode)(w, units, cfg)
    metrics |= {
        "ratio_mean": masked_mean(w, units),
        "ratio_max": masked_max(w, units),
        "ratio_min": masked_min(w, units),
        "ess": effective_sample_size(final, units),
        "logprob_abs_diff_mean": diff,
    }
    return zero_masked(final.expand_as(old), mask), metrics
