"""The full-distribution check: top-k overlap and vocabulary KL between engine and trainer at the positions
where the engine reported its top-k logprobs (part of every :class:`~vlrl.checks.agreement.AgreementReport`).

Library code: importable without pytest or torch (torch is imported inside the functions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistributionStats:
    """Full-distribution check at the positions where the engine reported its top-k."""

    n_positions: int
    k: int
    topk_overlap_min: float
    """Smallest exact top-k set overlap (|engine ∩ trainer| / k)."""
    topk_overlap_mean: float
    tie_aware_overlap_min: float
    """Smallest overlap counting an engine id as shared when the trainer ranks it within ``max_abs``
    of its own k-th logprob (near-ties may legitimately swap at the k boundary)."""
    vocab_kl_max: float
    vocab_kl_mean: float
    worst: str
    """The position with the largest vocabulary KL, described."""


def distribution_stats(
    engine_ids: torch.Tensor,
    engine_logprobs: torch.Tensor,
    trainer_topk_ids: torch.Tensor,
    trainer_topk_logprobs: torch.Tensor,
    trainer_at_engine_ids: torch.Tensor,
    *,
    tie_tolerance: float,
    labels: Sequence[str] | None = None,
) -> DistributionStats | None:
    """Top-k overlap and vocabulary KL at ``P`` probed positions (all inputs ``[P, k]``).

    The KL is KL(engine ‖ trainer) over k + 1 buckets: the engine's k ids, then one tail bucket
    holding the rest of the vocabulary (1 − top-k mass), the trainer's distribution coarsened the
    same way — so mass the trainer moves anywhere outside the engine's top-k still counts.
    """
    import torch

    P, k = engine_ids.shape
    if P == 0:
        return None
    e, q = engine_logprobs.detach().double().cpu(), trainer_at_engine_ids.detach().double().cpu()
    kl = torch.stack([_coarse_kl(e[i], q[i]) for i in range(P)])
    eids, tids = engine_ids.cpu().tolist(), trainer_topk_ids.cpu().tolist()
    exact = torch.tensor([len(set(a) & set(b)) / k for a, b in zip(eids, tids)], dtype=torch.float64)
    kth = trainer_topk_logprobs.detach().double().cpu()[:, -1:]
    tie = (q >= kth - tie_tolerance).double().mean(-1)
    j = int(torch.nan_to_num(kl, nan=math.inf).argmax())
    where = labels[j] if labels is not None else f"probe {j}"
    return DistributionStats(
        n_positions=P,
        k=k,
        topk_overlap_min=float(exact.min()),
        topk_overlap_mean=float(exact.mean()),
        tie_aware_overlap_min=float(tie.min()),
        vocab_kl_max=float(kl.max()),
        vocab_kl_mean=float(kl.mean()),
        worst=f"{where} (KL {float(kl[j]):.3g})",
    )


def _coarse_kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL over [top-k ids..., tail] from per-id logprobs ``[k]`` (float64)."""
    import torch

    q_tail = (-torch.expm1(torch.logsumexp(q_log, 0))).clamp(min=1e-300)
    p_tail = (-torch.expm1(torch.logsumexp(p_log, 0))).clamp(min=0.0)  # 1 − Σp without cancellation
    head = (p_log.exp() * (p_log - q_log)).sum()
    tail = p_tail * (torch.log(p_tail.clamp(min=1e-300)) - torch.log(q_tail)) if p_tail > 0 else p_tail * 0
    return head + tail
