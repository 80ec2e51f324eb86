"""The Tinker loss functions over one datum's per-token inputs, as a registry (``TINKER_LOSSES``).

Each loss takes the datum's logprobs of ``target_tokens`` ``[N]`` (with grad), its ``loss_fn_inputs``
as fp32 tensors ``[N]`` and the request's ``loss_fn_config``, and returns the datum's loss as a
**sum** over its tokens (Tinker's convention: a client that wants a mean scales its weights or
advantages) plus detached metrics. Semantics as the SDK documents them:

- ``cross_entropy``: ``-Σ weights · logp`` (inputs: target_tokens, weights)
- ``importance_sampling``: ``-Σ exp(logp - q) · A`` (inputs: target_tokens, logprobs = q, advantages)
- ``ppo``: ``-Σ min(r·A, clip(r, lo, hi)·A)``, ``r = exp(logp - q)``, ``lo``/``hi`` from
  ``clip_low_threshold`` / ``clip_high_threshold`` (default 0.8 / 1.2): vlrl's ``ppo_clip`` policy
  loss (``vlrl.algos``) with the dual clip off.

Tokens the loss must ignore carry weight 0 / advantage 0. Positions without a logprob (targets that
are vision placeholder ids, which the logprob contract leaves out) are masked before any of this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from vlrl.algos import AlgoConfig, get_policy_loss_fn
from vlrl.errors import BadInputError
from vlrl.registry import Registry

LossFn = Callable[[Tensor, Mapping[str, Tensor], Tensor, Mapping[str, float]], tuple[Tensor, dict[str, float]]]
"""``fn(logprobs [N], inputs {name: [N]}, mask [N] bool, config) -> (loss sum, metrics)``."""


class LossSpec:
    """A registered loss: the function, the inputs it needs besides ``target_tokens`` and the config keys it reads."""

    def __init__(self, fn: LossFn, needs: tuple[str, ...], config_keys: tuple[str, ...] = ()):
        self.fn, self.needs, self.config_keys = fn, needs, config_keys


TINKER_LOSSES: Registry[LossSpec] = Registry("tinker loss function")


def check_inputs(loss_fn: str, inputs: Mapping[str, object], config: Mapping[str, float], where: str) -> LossSpec:
    """The loss's spec, after checking the datum has every input it needs and the config only known keys."""
    spec = TINKER_LOSSES.get(loss_fn)
    missing = [k for k in ("target_tokens", *spec.needs) if k not in inputs]
    if missing:
        raise BadInputError(f"{where}: loss_fn {loss_fn!r} needs loss_fn_inputs {missing}")
    unknown = sorted(set(config) - set(spec.config_keys))
    if unknown:
        raise BadInputError(
            f"loss_fn_config keys {unknown} are not supported by {loss_fn!r} "
            f"(supported: {list(spec.config_keys) or 'none'})"
        )
    return spec


def _cross_entropy(logp: Tensor, inputs: Mapping[str, Tensor], mask: Tensor, config: Mapping[str, float]):
    w = torch.where(mask, inputs["weights"], 0.0)
    loss = -(torch.where(mask, logp, 0.0) * w).sum()
    return loss, {"weight_sum": float(w.sum())}


def _importance_sampling(logp: Tensor, inputs: Mapping[str, Tensor], mask: Tensor, config: Mapping[str, float]):
    adv = torch.where(mask, inputs["advantages"], 0.0)
    log_ratio = torch.where(mask, logp - inputs["logprobs"], 0.0).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    return -(ratio * adv).sum(), {"ratio_max": float(ratio.detach().max()) if ratio.numel() else 1.0}


def _ppo(logp: Tensor, inputs: Mapping[str, Tensor], mask: Tensor, config: Mapping[str, float]):
    lo, hi = float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))
    if not 0 <= lo <= 1 <= hi:
        raise BadInputError(f"ppo: need 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got {lo}, {hi}")
    cfg = AlgoConfig(eps_clip_low=1.0 - lo, eps_clip_high=hi - 1.0, clip_ratio_c=None)
    m = mask.to(logp.dtype)[None]
    loss, metrics = get_policy_loss_fn("ppo_clip")(
        logp[None], inputs["logprobs"][None], inputs["advantages"][None], m, cfg
    )
    return loss.sum(), {"clipfrac": float(metrics["clipfrac"])}


TINKER_LOSSES.add("cross_entropy", LossSpec(_cross_entropy, ("weights",)))
TINKER_LOSSES.add("importance_sampling", LossSpec(_importance_sampling, ("logprobs", "advantages")))
TINKER_LOSSES.add("ppo", LossSpec(_ppo, ("logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold")))
