"""Training curves and logprob-drift plots as PNG bytes (matplotlib, Agg backend, imported lazily).

Every function returns ``None`` when its data is absent, so a report of a run that is still
starting (or a run without RL) simply leaves the figure out.
"""

from __future__ import annotations

import io
import math
from typing import Any

from vlrl.report.runfiles import RunFiles, series

_SIZE = (6.0, 3.2)  # inches; at 80 dpi a 480x256 PNG of ~20-40 kB
_DPI = 80


def _pyplot():
    # Agg before pyplot is imported anywhere: reports are written on headless machines and in tests.
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _step_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _png(fig) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI)
    plt.close(fig)
    return buf.getvalue()


def reward_curve(run: RunFiles) -> bytes | None:
    """RL ``reward_mean`` and eval ``eval_reward_mean`` / ``eval_success`` against step."""
    fig = reward_figure(run)
    return _png(fig) if fig is not None else None


def reward_figure(run: RunFiles):
    """:func:`reward_curve`'s matplotlib figure, ``None`` without a reward."""
    lines = [
        ("train reward_mean", series(run.phase("rl"), "reward_mean"), "-"),
        ("eval reward_mean", series(run.phase("eval"), "eval_reward_mean"), "o-"),
        ("eval success", series(run.phase("eval"), "eval_success"), "s--"),
    ]
    lines = [line for line in lines if line[1][0]]
    if not lines:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    for label, (xs, ys), style in lines:
        ax.plot(xs, ys, style, label=label, markersize=4)
    # Evals at the same step (before / after SFT) are told apart by the label the trainer gives them.
    seen: dict[tuple, int] = {}
    for row in run.phase("eval"):
        if isinstance(row.get("label"), str) and _num(row.get("eval_reward_mean")) and _num(row.get("step")):
            at = (row["step"], row["eval_reward_mean"])
            seen[at] = seen.get(at, -1) + 1  # stack labels sharing a point instead of overprinting
            ax.annotate(row["label"], at, fontsize=6, xytext=(3, 3 + 7 * seen[at]), textcoords="offset points")
    ax.margins(x=0.08)  # room for the labels of the last eval
    steps = {x for _, (xs, _), _ in lines for x in xs}
    if len(steps) == 1:  # one step (an SFT-only run's eval): a step on each side, not ±0.05 of one
        ax.set_xlim(min(steps) - 1, min(steps) + 1)
    values = [y for _, (_, ys), _ in lines for y in ys]
    if all(0.0 <= y <= 1.0 for y in values):  # rates and 0/1 rewards: keep the full scale visible
        ax.set_ylim(-0.05, 1.1)
    threshold = (run.summary or {}).get("threshold")
    if isinstance(threshold, (int, float)):
        ax.axhline(threshold, color="gray", linestyle=":", label=f"threshold {threshold:g}")
    _step_axis(ax)
    ax.set_ylabel("reward")
    ax.set_title("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def loss_curve(run: RunFiles) -> bytes | None:
    """SFT and RL loss, one panel per phase (their step counters are independent), each with its learning-rate
    factor on a second axis where the schedule moved (:func:`lr_schedule`)."""
    fig = loss_figure(run)
    return _png(fig) if fig is not None else None


def loss_figure(run: RunFiles):
    """:func:`loss_curve`'s matplotlib figure (``None`` without a loss): one axis per phase, a twin axis for the
    phase's schedule."""
    panels = [(phase, series(run.phase(phase), "loss")) for phase in ("sft", "rl")]
    panels = [(phase, xy) for phase, xy in panels if xy[0]]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=_SIZE, squeeze=False)
    for ax, (phase, (xs, ys)) in zip(axes[0], panels):
        ax.plot(xs, ys, "-", color="tab:red" if phase == "rl" else "tab:purple")
        _step_axis(ax)
        ax.set_title(f"{phase} loss")
        ax.grid(alpha=0.3)
        lr = lr_schedule(run.phase(phase))
        if lr:
            # A loss that falls only as the rate decays reads differently from one that falls at a fixed rate.
            twin = ax.twinx()
            twin.plot(*lr, "--", color="gray", linewidth=1)
            twin.set_ylim(0.0, 1.05 * max(lr[1]))
            twin.set_ylabel("lr factor", fontsize=7, color="gray")
            twin.tick_params(labelsize=7, colors="gray")
    return fig


def lr_schedule(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]] | None:
    """``(steps, lr_factor)`` of a phase's rows (the trainer's warm-up, the maze curriculum's SFT schedule), or
    ``None`` when they carry none or it never moved."""
    xs, ys = series(rows, "lr_factor")
    return (xs, ys) if ys and min(ys) != max(ys) else None


def drift_curve(run: RunFiles) -> bytes | None:
    """Max and mean |rollout − trainer| logprob per RL step on a log scale, breaches in red."""
    rows = run.agreement
    max_xy, mean_xy = series(rows, "max_abs"), series(rows, "mean_abs")
    if not max_xy[0]:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    ax.plot(max_xy[0], _floor(max_xy[1]), "-", label="max |Δ|")
    if mean_xy[0]:
        ax.plot(mean_xy[0], _floor(mean_xy[1]), "-", label="mean |Δ|")
    breached = [(r["step"], float(r["max_abs"])) for r in rows if r.get("breached") and _num(r.get("max_abs"))]
    if breached:
        ax.scatter(
            [b[0] for b in breached], _floor([b[1] for b in breached]), color="red", zorder=3, label="bound breached"
        )
    bounds = bound_values(rows[-1]) if rows else {}
    for key, style in (("max_abs", "--"), ("mean_abs", ":")):
        if key in bounds:
            ax.axhline(bounds[key], color="black", linestyle=style, linewidth=1, label=f"bound {key} {bounds[key]:g}")
    ax.set_yscale("log")
    _step_axis(ax)
    ax.set_ylabel("|Δ logprob|")
    ax.set_title("rollout vs trainer logprob drift")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _png(fig)


def drift_histogram(row: dict[str, Any]) -> bytes | None:
    """The |Δ| histogram of one agreement row (``hist.edges`` / ``hist.counts``, log10 bins)."""
    hist = row.get("hist") or {}
    edges, counts = hist.get("edges"), hist.get("counts")
    if not edges or not counts or len(edges) != len(counts) + 1:
        return None
    # Edges are either log10 exponents (e.g. -12 … 0: some are <= 0) or |Δ| values on log-spaced
    # bins (all > 0); plot both on a log10 axis.
    exponents = [float(e) for e in edges] if min(edges) <= 0 else [math.log10(float(e)) for e in edges]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    widths = [b - a for a, b in zip(exponents, exponents[1:])]
    ax.bar(exponents[:-1], counts, width=widths, align="edge", edgecolor="black", linewidth=0.5)
    bounds = bound_values(row)
    for key, style in (("max_abs", "--"), ("mean_abs", ":")):
        if bounds.get(key, 0) > 0:
            ax.axvline(math.log10(bounds[key]), color="red", linestyle=style, label=f"bound {key} {bounds[key]:g}")
    if bounds:
        ax.legend(fontsize=7)
    # Trainers clamp |Δ| to the lowest edge before the log, so exact agreement lands in the first bin.
    ax.set_xlabel("log10 |rollout − trainer logprob|  (first bin includes |Δ| = 0, last |Δ| ≥ 1)")
    ax.set_ylabel("tokens")
    ax.set_title(f"drift histogram, step {row.get('step', '?')}")
    ax.grid(alpha=0.3)
    return _png(fig)


def bound_values(row: dict[str, Any]) -> dict[str, float]:
    """Bounds an agreement row carries: ``{"bounds": {"max_abs": ..}}``, ``"bound"`` or ``"max_abs_bound"``."""
    out = {}
    nested = row.get("bounds")
    if isinstance(nested, dict):
        out = {k: float(v) for k, v in nested.items() if k in ("max_abs", "mean_abs") and _num(v)}
    for key, name in (("bound", "max_abs"), ("max_abs_bound", "max_abs"), ("mean_abs_bound", "mean_abs")):
        if _num(row.get(key)):
            out.setdefault(name, float(row[key]))
    return out


def _floor(values: list[float]) -> list[float]:
    # A log axis cannot show exact agreement (0); draw it at a visible floor instead of dropping it.
    return [max(v, 1e-12) for v in values]


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
