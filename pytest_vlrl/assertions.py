"""Plugin assertions: thin layers over ``vlrl.checks`` with failure messages a person can act on."""

from __future__ import annotations

from typing import Any

from vlrl.checks.agreement import AgreementBounds, AgreementReport, batch_agreement, compare_logprobs


def assert_logprobs_agree(
    rollout: Any,
    trainer: Any,
    *,
    mask: Any = None,
    dtype: Any = "float32",
    bounds: AgreementBounds | None = None,
    tokenizer: Any = None,
    turn_index: Any = None,
    uids: Any = None,
    token_ids: Any = None,
    n_worst: int = 8,
) -> AgreementReport:
    """Fail unless rollout and trainer logprobs agree within ``bounds`` (default: by ``dtype``).

    Either ``rollout`` is a ``vlrl.train.batch.Batch`` and ``trainer`` its ``policy_forward``
    output (or a ``[B, L]`` logprob tensor): mask, turns, uids, tokens and the engine's top-k come
    from the batch. Or both are ``[B, L]`` logprob tensors and ``mask`` (1 on generated tokens) is
    given. ``tokenizer`` decodes the worst tokens in the message. Returns the report when it passes.
    """
    __tracebackhide__ = True
    report = _report(
        rollout,
        trainer,
        mask=mask,
        dtype=dtype,
        bounds=bounds,
        turn_index=turn_index,
        uids=uids,
        token_ids=token_ids,
        n_worst=n_worst,
    )
    if report.breached:
        raise AssertionError(format_report(report, tokenizer))
    return report


def _report(rollout, trainer, *, mask, dtype, bounds, turn_index, uids, token_ids, n_worst) -> AgreementReport:
    if hasattr(rollout, "rollout_logprobs"):  # a Batch
        out = trainer if hasattr(trainer, "logprobs") else _Out(trainer)
        return batch_agreement(rollout, out, dtype=dtype, bounds=bounds, n_worst=n_worst)
    if mask is None:
        raise TypeError("assert_logprobs_agree(rollout_tensor, trainer_tensor) needs mask= (1 on generated tokens)")
    trainer = trainer.logprobs if hasattr(trainer, "logprobs") else trainer
    return compare_logprobs(
        rollout,
        trainer,
        mask,
        turn_index=turn_index,
        uids=uids,
        token_ids=token_ids,
        dtype=dtype,
        bounds=bounds,
        n_worst=n_worst,
    )


class _Out:
    def __init__(self, logprobs):
        self.logprobs, self.probe = logprobs, None


def format_report(report: AgreementReport, tokenizer: Any = None) -> str:
    """The failure message: breaches, the per-turn table, the worst positions (decoded), the distribution check."""
    b, o = report.bounds, report.overall
    lines = [
        "rollout and trainer logprobs disagree"
        + (f" (temperature {report.temperature:g})" if report.temperature is not None else "")
        + ":"
    ]
    lines += [f"  - {x}" for x in report.breaches]
    lines.append(
        f"bounds: max |Δ| {b.max_abs:g}, mean |Δ| {b.mean_abs:g}, k3 {b.k3:g}, "
        f"vocabulary KL {b.vocab_kl:g}, top-k overlap >= {b.min_topk_overlap:g}"
    )
    lines.append("")
    lines.append(
        f"{'turn':>5} {'tokens':>7} {'max |Δ|':>10} {'mean |Δ|':>10} {'k3 KL':>10} {'ratio min':>10} {'ratio max':>10}"
    )
    for t in report.turns:
        lines.append(_row(str(t.turn), t.stats))
    lines.append(_row("all", o))
    lines.append("")
    lines.append("worst positions (Δ = trainer − rollout):")
    for p in report.worst:
        tok = f" {_decode(tokenizer, p.token_id)!r}" if tokenizer is not None and p.token_id >= 0 else ""
        lines.append(f"  {p.describe()}{tok}")
    d = report.distribution
    if d is not None:
        lines.append("")
        lines.append(
            f"full distribution at {d.n_positions} positions (engine top-{d.k} + tail): vocabulary KL max "
            f"{d.vocab_kl_max:.3g} mean {d.vocab_kl_mean:.3g}; top-{d.k} overlap min {d.topk_overlap_min:.2f} "
            f"mean {d.topk_overlap_mean:.2f} (tie-aware min {d.tie_aware_overlap_min:.2f}); worst {d.worst}"
        )
    return "\n".join(lines)


def _row(name: str, s) -> str:
    return (
        f"{name:>5} {s.n_tokens:>7} {s.max_abs:>10.3g} {s.mean_abs:>10.3g} {s.k3:>10.3g} "
        f"{s.ratio_min:>10.4g} {s.ratio_max:>10.4g}"
    )


def _decode(tokenizer, token_id: int) -> str:
    try:
        return tokenizer.decode([token_id])
    except Exception as exc:  # noqa: BLE001 — a message helper must not hide the real failure
        return f"<undecodable {token_id}: {exc}>"
