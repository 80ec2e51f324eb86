"""Rollout-vs-trainer logprob agreement: per-turn statistics, dtype-aware bounds, where a gap sits (by depth,
first token vs rest); the full-distribution check is :mod:`vlrl.checks.distribution`.

The rollout engine and the trainer must compute the same ``log_softmax(logits / T)[token]`` (the
engine logprob contract) for every generated token; any systematic gap (temperature on one side,
wrong images, wrong positions, a shifted mask) makes training silently off-policy. This module
turns two ``[B, L]`` logprob tensors into an :class:`AgreementReport` (statistics, worst positions,
whether a bound is breached) that a training loop logs every step and a test asserts on.

Library code: importable without pytest or torch (torch is imported inside the functions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vlrl.checks.bounds import AgreementBounds
from vlrl.checks.distribution import DistributionStats, distribution_stats

if TYPE_CHECKING:
    import torch


class LogprobDisagreementError(RuntimeError):
    """Rollout and trainer logprobs disagree beyond the bounds; ``report`` holds the details."""

    def __init__(self, message: str, report: AgreementReport):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Stats:
    """Agreement over a set of generated tokens (Δ = trainer − rollout logprob; ratio = exp(Δ))."""

    n_tokens: int
    max_abs: float
    mean_abs: float
    k3: float
    ratio_min: float
    ratio_max: float


@dataclass(frozen=True)
class TurnStats:
    turn: int
    """Turn index (-1: generated tokens outside any recorded turn)."""
    stats: Stats


@dataclass(frozen=True)
class Position:
    """One generated token: where it is and both logprobs."""

    row: int
    uid: str
    turn: int
    position: int
    token_id: int
    rollout: float
    trainer: float

    @property
    def delta(self) -> float:
        return self.trainer - self.rollout

    def describe(self) -> str:
        return (
            f"trajectory {self.uid} (row {self.row}), turn {self.turn}, token position {self.position} "
            f"(id {self.token_id}): rollout {self.rollout:.6g}, trainer {self.trainer:.6g}, Δ {self.delta:+.3g}"
        )


DEPTH_BINS = (0, 512, 1024, 2048, 4096)
"""Lower edges of the context-depth bins (tokens before the position): 0–512, 512–1k, 1–2k, 2–4k, 4k+."""


@dataclass(frozen=True)
class Breakdown:
    """Where the disagreement sits: |Δ| statistics by context depth and by position within the turn.

    A kernel or cache bug shows as one bad bin (e.g. only the first token of a turn, only past 1k
    tokens), where the overall numbers only say that something is off.
    """

    by_depth: tuple[tuple[str, Stats], ...]
    """(bin label, stats) for the non-empty :data:`DEPTH_BINS` bins."""
    by_turn_position: tuple[tuple[str, Stats], ...]
    """("first", stats) for the first generated token of each turn (predicted from the prompt's
    last position: prefill), ("rest", stats) for the others (decode)."""

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """JSON-ready: ``{"by_depth": [{"bin", "n_tokens", "max_abs", "mean_abs"}], "by_turn_position": [...]}``."""

        def table(items):
            return [
                {"bin": label, "n_tokens": s.n_tokens, "max_abs": s.max_abs, "mean_abs": s.mean_abs}
                for label, s in items
            ]

        return {"by_depth": table(self.by_depth), "by_turn_position": table(self.by_turn_position)}


@dataclass(frozen=True)
class AgreementReport:
    overall: Stats
    turns: tuple[TurnStats, ...]
    worst: tuple[Position, ...]
    """The largest |Δ| first."""
    bounds: AgreementBounds
    breakdown: Breakdown | None = None
    distribution: DistributionStats | None = None
    breaches: tuple[str, ...] = ()
    temperature: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def breached(self) -> bool:
        return bool(self.breaches)

    def metrics(self, prefix: str = "agreement/") -> dict[str, float]:
        """Flat scalars for logging (overall, per turn, distribution, and ``breached`` as 0/1)."""
        out = {f"{prefix}{k}": float(v) for k, v in vars(self.overall).items()}
        for t in self.turns:
            out.update({f"{prefix}turn{t.turn}/{k}": float(v) for k, v in vars(t.stats).items()})
        if self.breakdown is not None:
            for group in (self.breakdown.by_depth, self.breakdown.by_turn_position):
                out.update(
                    {
                        f"{prefix}bin/{label}/{k}": float(v)
                        for label, s in group
                        for k, v in vars(s).items()
                        if k in ("n_tokens", "max_abs", "mean_abs")
                    }
                )
        if self.distribution is not None:
            out.update(
                {
                    f"{prefix}dist/{k}": float(v)
                    for k, v in vars(self.distribution).items()
                    if isinstance(v, (int, float))
                }
            )
        out[f"{prefix}breached"] = float(self.breached)
        return out

    def summary(self) -> str:
        o = self.overall
        lines = [
            f"{o.n_tokens} generated tokens: max |Δ| {o.max_abs:.3g} (bound {self.bounds.max_abs:g}), "
            f"mean |Δ| {o.mean_abs:.3g} (bound {self.bounds.mean_abs:g}), k3 {o.k3:.3g} (bound {self.bounds.k3:g}), "
            f"ratio [{o.ratio_min:.4g}, {o.ratio_max:.4g}]"
        ]
        lines += [f"  breach: {b}" for b in self.breaches]
        return "\n".join(lines)

    def raise_if_breached(self) -> None:
        if self.breached:
            worst = self.worst[0].describe() if self.worst else "no generated tokens"
            raise LogprobDisagreementError(
                f"rollout and trainer logprobs disagree: {'; '.join(self.breaches)}. Worst: {worst}", self
            )


def compare_logprobs(
    rollout: torch.Tensor,
    trainer: torch.Tensor,
    mask: torch.Tensor,
    *,
    turn_index: torch.Tensor | None = None,
    uids: Sequence[str] | None = None,
    token_ids: torch.Tensor | None = None,
    dtype: Any = "float32",
    bounds: AgreementBounds | None = None,
    distribution: DistributionStats | None = None,
    n_worst: int = 5,
    temperature: float | None = None,
) -> AgreementReport:
    """Compare rollout and trainer logprobs ``[B, L]`` where ``mask`` ``[B, L]`` is 1 (generated tokens).

    ``turn_index`` ``[B, L]`` gives per-turn statistics, ``uids`` / ``token_ids`` name positions;
    ``bounds`` default to ``AgreementBounds.for_dtype(dtype)``. Never raises on disagreement:
    check ``report.breached`` or call ``report.raise_if_breached()``.
    """
    import torch

    if rollout.shape != trainer.shape or rollout.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: rollout {tuple(rollout.shape)}, trainer {tuple(trainer.shape)}, mask {tuple(mask.shape)}"
        )
    bounds = bounds or AgreementBounds.for_dtype(dtype)
    r, t = rollout.detach().double().cpu(), trainer.detach().double().cpu()
    m = mask.detach().cpu().bool()
    turns = turn_index.detach().cpu() if turn_index is not None else torch.zeros_like(m, dtype=torch.long)
    overall = _stats(r[m], t[m])
    per_turn = tuple(
        TurnStats(int(k), _stats(r[m & (turns == k)], t[m & (turns == k)])) for k in sorted(set(turns[m].tolist()))
    )
    worst = _worst(r, t, m, turns, uids, token_ids, n_worst)
    breaches = _breaches(overall, distribution, bounds)
    return AgreementReport(
        overall=overall,
        turns=per_turn,
        worst=worst,
        bounds=bounds,
        breakdown=breakdown(r, t, m, turns),
        distribution=distribution,
        breaches=breaches,
        temperature=temperature,
    )


def breakdown(rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor, turn_index: torch.Tensor) -> Breakdown:
    """|Δ| by context depth and first-vs-rest token of each turn; all inputs ``[B, L]`` (rows left-aligned:
    the column is the number of tokens before the position)."""
    import torch

    m = mask.bool()
    depth = torch.arange(m.shape[1]).expand_as(m)
    by_depth = []
    for lo, hi in zip(DEPTH_BINS, [*DEPTH_BINS[1:], None], strict=True):
        sel = m & (depth >= lo) & (depth < hi if hi is not None else True)
        if sel.any():
            by_depth.append((_bin_label(lo, hi), _stats(rollout[sel], trainer[sel])))
    first = _first_of_turn(m, turn_index)
    by_pos = tuple(
        (label, _stats(rollout[sel], trainer[sel]))
        for label, sel in (("first", first), ("rest", m & ~first))
        if sel.any()
    )
    return Breakdown(by_depth=tuple(by_depth), by_turn_position=by_pos)


def _bin_label(lo: int, hi: int | None) -> str:
    def k(n: int) -> str:
        return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)

    return f"{k(lo)}+" if hi is None else f"{k(lo)}-{k(hi)}"


def _first_of_turn(m: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` bool: the first generated (mask 1) position of each turn of each row: where the turn
    index changes or the generated positions resume after a gap."""
    import torch

    first = torch.zeros_like(m)
    for b in range(m.shape[0]):
        idx = m[b].nonzero()[:, 0]
        if idx.numel() == 0:
            continue
        t = turns[b, idx]
        new = torch.ones_like(t, dtype=torch.bool)
        new[1:] = (t[1:] != t[:-1]) | (idx[1:] != idx[:-1] + 1)  # a new turn, or a gap (a prompt in between)
        first[b, idx[new]] = True
    return first


def batch_agreement(
    batch: Any, out: Any, *, dtype: Any = "float32", bounds: AgreementBounds | None = None, n_worst: int = 5
) -> AgreementReport:
    """:func:`compare_logprobs` for a ``vlrl.train.batch.Batch`` and its ``policy_forward`` output.

    Compares ``batch.rollout_logprobs`` (the rollout's) with ``out.logprobs`` on ``batch.loss_mask``,
    per turn; when ``out.probe`` is set (``policy_forward(..., probe=True)`` with the engine's
    top-k in the batch) the full-distribution check is included.
    """
    bounds = bounds or AgreementBounds.for_dtype(dtype)
    dist = None
    top, probe = getattr(batch, "engine_topk", None), getattr(out, "probe", None)
    if top is not None and probe is not None:
        labels = [
            f"trajectory {batch.uids[r]} token position {p}" for r, p in zip(top.rows.tolist(), top.positions.tolist())
        ]
        dist = distribution_stats(
            top.ids,
            top.logprobs,
            probe.topk_ids,
            probe.topk_logprobs,
            probe.at_engine_ids,
            tie_tolerance=bounds.max_abs,
            labels=labels,
        )
    return compare_logprobs(
        batch.rollout_logprobs,
        out.logprobs,
        batch.loss_mask,
        turn_index=batch.turn_index,
        uids=batch.uids,
        token_ids=batch.input_ids,
        bounds=bounds,
        distribution=dist,
        n_worst=n_worst,
        temperature=batch.temperature,
    )


def _stats(r: torch.Tensor, t: torch.Tensor) -> Stats:
    import torch

    if r.numel() == 0:
        return Stats(0, 0.0, 0.0, 0.0, 1.0, 1.0)
    d = t - r
    if not bool(torch.isfinite(d).all()):  # -inf / nan on one side: as bad as it gets, and said so
        return Stats(int(r.numel()), math.inf, math.inf, math.inf, 0.0, math.inf)
    k3 = (torch.exp(d) - 1 - d).mean()
    ratio = torch.exp(d)
    return Stats(
        int(r.numel()), float(d.abs().max()), float(d.abs().mean()), float(k3), float(ratio.min()), float(ratio.max())
    )


def _worst(r, t, m, turns, uids, token_ids, n: int) -> tuple[Position, ...]:
    import torch

    d = torch.where(m, (t - r).abs().nan_to_num(math.inf), torch.full_like(r, -1.0))
    flat = torch.argsort(d.flatten(), descending=True)[: min(n, int(m.sum()))]
    out = []
    for f in flat.tolist():
        b, p = divmod(f, r.shape[1])
        out.append(
            Position(
                row=b,
                uid=uids[b] if uids is not None else str(b),
                turn=int(turns[b, p]),
                position=p,
                token_id=int(token_ids[b, p]) if token_ids is not None else -1,
                rollout=float(r[b, p]),
                trainer=float(t[b, p]),
            )
        )
    return tuple(out)


def _breaches(o: Stats, dist: DistributionStats | None, bounds: AgreementBounds) -> tuple[str, ...]:
    out = []
    if not o.max_abs <= bounds.max_abs:
        out.append(f"max |Δ| {o.max_abs:.3g} > {bounds.max_abs:g}")
    if not o.mean_abs <= bounds.mean_abs:
        out.append(f"mean |Δ| {o.mean_abs:.3g} > {bounds.mean_abs:g}")
    if not o.k3 <= bounds.k3:
        out.append(f"k3 KL {o.k3:.3g} > {bounds.k3:g}")
    if dist is not None:
        if not dist.vocab_kl_max <= bounds.vocab_kl:
            out.append(f"vocabulary KL {dist.vocab_kl_max:.3g} > {bounds.vocab_kl:g} at {dist.worst}")
        if not dist.tie_aware_overlap_min >= bounds.min_topk_overlap:
            out.append(f"top-{dist.k} overlap {dist.tie_aware_overlap_min:.2f} < {bounds.min_topk_overlap:g}")
    return tuple(out)
