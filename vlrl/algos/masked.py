"""Masked reductions shared by the algorithm modules. Masks are 0/1 (bool or float) tensors."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1. ``x`` and ``mask`` broadcast to one shape.

    Masked positions are selected away (``torch.where``), not multiplied by 0, so ``±inf``
    padding there cannot turn the sum into NaN.
    """
    xm = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1; 0 where nothing is unmasked."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_std(x: Tensor, mask: Tensor) -> Tensor:
    """Unbiased (Bessel-corrected) std of ``x`` over unmasked positions; 0 if fewer than two."""
    m = mask.to(x.dtype)
    n = m.sum()
    mean = masked_sum(x, m) / n.clamp(min=1)
    var = masked_sum((x - mean) ** 2, m) / (n - 1).clamp(min=1)
    return var.sqrt()


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest ``x`` over unmasked positions; 0 if nothing is unmasked."""
    if not bool(mask.any()):
        return x.new_zeros(())
    return x.masked_fill(~mask.bool(), float("-inf")).max()


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    """Smallest ``x`` over unmasked positions; 0 if nothing is unmasked."""
    if not bool(mask.any()):
        return x.new_zeros(())
    return x.masked_fill(~mask.bool(), float("inf")).min()


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` is 1, exactly 0 elsewhere (also where ``x`` is ±inf)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def check_same_shape(**tensors: Tensor) -> None:
    """Raise ``ValueError`` naming the tensors when their shapes differ."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"shape mismatch: {shapes}")


def safe_log_ratio(logp: Tensor, logq: Tensor, clamp: float) -> Tensor:
    """``logp - logq`` clamped to ``[-clamp, clamp]`` so that ``exp`` of it stays finite."""
    return (logp - logq).clamp(min=-clamp, max=clamp)


__all__ = [
    "check_same_shape",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_std",
    "masked_sum",
    "safe_log_ratio",
    "zero_masked",
]
