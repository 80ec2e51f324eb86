"""The report's "learning signal" section: is RL getting a gradient, and where does it go?

Reads the per-step diagnostics the trainer writes to ``metrics.jsonl`` (``vlrl.train.trainer``,
``vlrl.algos.diagnostics``):

- advantages: ``adv_abs_mean`` (mean |A| over trained tokens), ``adv_zero_group_frac`` (groups with
  no gradient at all), ``reward_equal_group_frac`` (groups whose returns are all equal);
- gradient norms by module, before clipping: ``grad_norm/vision`` (vision tower), ``grad_norm/merger``
  (projector), ``grad_norm/language`` (decoder layers), ``grad_norm/embed`` (token embedding / head);
- entropy: ``entropy`` (mean over trained tokens) and ``entropy_first_token`` (the first token of each
  reply, the one decision in a one-word answer).

``learning_section(run)`` is the HTML; ``learning_figures(run)`` the same figures as PNG bytes (for
pytest-html extras). Absent data leaves its figure out; a run without any leaves the section empty.
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any

from vlrl.report.plots import _SIZE, _png, _pyplot, _step_axis
from vlrl.report.runfiles import RunFiles, series

MODULES = ("vision", "merger", "language", "embed")
"""Module groups of ``grad_norm/<group>`` in plotting order (``vlrl.train.trainer.PARAM_GROUPS``)."""
_LABELS = {
    "vision": "vision tower",
    "merger": "projector (merger)",
    "language": "language layers",
    "embed": "embedding / lm head",
}
_CURVE_STEPS = 12
"""Reward-curve table: at most this many RL steps are listed (evenly spaced, always the last)."""


def learning_section(run: RunFiles) -> str:
    """HTML: advantage statistics, gradient norms by module and entropy against step, a per-step reward
    table and one line of findings; ``""`` when the run logged none of these metrics."""
    figs = learning_figures(run)
    table = reward_table(run)
    if not figs and not table:
        return ""
    imgs = "".join(_img(png, name) for name, png in figs.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in learning_notes(run))
    return (
        f"<h2>Learning signal</h2>{f'<ul style=font-size:13px>{notes}</ul>' if notes else ''}"
        f"<div class='figs'>{imgs}</div>{table}"
    )


def learning_figures(run: RunFiles) -> dict[str, bytes]:
    """``{name: png}`` of the advantage, gradient-norm and entropy figures that have data."""
    made = {"advantages": advantage_figure(run), "grad norms": grad_norm_figure(run), "entropy": entropy_figure(run)}
    return {name: png for name, png in made.items() if png}


def advantage_figure(run: RunFiles) -> bytes | None:
    """Mean |A| (left axis) and the fractions of zero-advantage and equal-return groups (right axis)."""
    rl = run.phase("rl")
    abs_mean = series(rl, "adv_abs_mean")
    fracs = [
        ("zero-advantage groups", series(rl, "adv_zero_group_frac"), "--"),
        ("equal-return groups", series(rl, "reward_equal_group_frac"), ":"),
    ]
    fracs = [f for f in fracs if f[1][0]]
    if not abs_mean[0] and not fracs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    handles = []
    if abs_mean[0]:
        handles += ax.plot(*abs_mean, "-", color="tab:blue", label="mean |A|")
    ax.set_ylabel("mean |A|")
    right = ax.twinx()
    for (label, xy, style), color in zip(fracs, ("tab:red", "tab:gray")):
        handles += right.plot(*xy, style, color=color, label=label)
    right.set_ylim(-0.05, 1.05)
    right.set_ylabel("fraction of groups")
    _step_axis(ax)
    ax.set_title("advantages (RL)")
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="best")
    return _png(fig)


def grad_norm_figure(run: RunFiles) -> bytes | None:
    """Gradient norm of each module group before clipping, log scale; one panel per phase (SFT, RL)."""
    panels = []
    for phase in ("sft", "rl"):
        rows = run.phase(phase)
        lines = [(m, series(rows, f"grad_norm/{m}")) for m in MODULES]
        lines = [(m, xy) for m, xy in lines if xy[0]]
        if lines:
            panels.append((phase, lines))
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=_SIZE, squeeze=False)
    for ax, (phase, lines) in zip(axes[0], panels):
        for m, (xs, ys) in lines:
            ax.plot(xs, [max(y, 1e-12) for y in ys], "-", label=_LABELS[m])  # a log axis cannot show 0
        ax.set_yscale("log")
        _step_axis(ax)
        ax.set_title(f"{phase} grad norm by module", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=6)
    return _png(fig)


def entropy_figure(run: RunFiles) -> bytes | None:
    """RL policy entropy per step: over all trained tokens and over each reply's first token."""
    rl = run.phase("rl")
    lines = [
        ("all trained tokens", series(rl, "entropy"), "-"),
        ("first token of a reply", series(rl, "entropy_first_token"), "--"),
    ]
    lines = [line for line in lines if line[1][0]]
    if not lines:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE)
    for label, xy, style in lines:
        ax.plot(*xy, style, label=label)
    _step_axis(ax)
    ax.set_ylabel("entropy (nats)")
    ax.set_title("policy entropy (RL, sampled tokens)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)


def reward_table(run: RunFiles) -> str:
    """HTML table of RL ``reward_mean`` per step (at most ``_CURVE_STEPS`` steps) and every eval."""
    rl_x, rl_y = series(run.phase("rl"), "reward_mean")
    evals = [
        (r.get("step"), r.get("label"), r.get("eval_reward_mean"))
        for r in run.phase("eval")
        if _num(r.get("eval_reward_mean"))
    ]
    if not rl_x and not evals:
        return ""
    rows = []
    if rl_x:
        picks = _spread(len(rl_x), _CURVE_STEPS)
        rows.append("<tr><td>RL step</td>" + "".join(f"<td>{int(rl_x[i])}</td>" for i in picks) + "</tr>")
        rows.append("<tr><td>train reward</td>" + "".join(f"<td>{rl_y[i]:.2f}</td>" for i in picks) + "</tr>")
    if evals:
        rows.append(
            "<tr><td>eval (step, label)</td>"
            + "".join(f"<td>{_step_text(s)} {html.escape(str(label or ''))}</td>" for s, label, _ in evals)
            + "</tr>"
        )
        rows.append("<tr><td>eval reward</td>" + "".join(f"<td><b>{v:.2f}</b></td>" for _, _, v in evals) + "</tr>")
    return f"<table class='kv' style='font-size:12px'>{''.join(rows)}</table>"


def learning_notes(run: RunFiles) -> list[str]:
    """Plain-text findings over the RL steps: mean |A|, zero-advantage groups, gradient share per module."""
    rl = run.phase("rl")
    notes = []
    abs_mean, zero = _mean(rl, "adv_abs_mean"), _mean(rl, "adv_zero_group_frac")
    if abs_mean is not None and zero is not None:
        notes.append(
            f"over {len(rl)} RL steps: mean |A| {abs_mean:.3g}; {zero:.0%} of groups had zero advantage "
            "(no gradient from them)"
        )
    medians = {m: _median(rl, f"grad_norm/{m}") for m in MODULES}
    norms = {m: v for m, v in medians.items() if v is not None}
    if len(norms) > 1 and max(norms.values()) > 0:
        top = max(norms, key=lambda m: norms[m])
        parts = ", ".join(
            f"{_LABELS[m]} {v:.2g}" + ("" if m == top else f" ({v / norms[top]:.1%} of it)")
            for m, v in sorted(norms.items(), key=lambda kv: -kv[1])
        )
        notes.append(f"median grad norm by module (before clipping): {parts}")
    ent = series(rl, "entropy_first_token")[1] or series(rl, "entropy")[1]
    if ent:
        notes.append(f"entropy (first token of a reply): {ent[0]:.3g} at the first RL step, {ent[-1]:.3g} at the last")
    return notes


# ---------------------------------------------------------------- helpers


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>"


def _spread(n: int, k: int) -> list[int]:
    """At most ``k`` indices of ``range(n)``, evenly spread, the first and the last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _step_text(step: Any) -> str:
    return str(int(step)) if _num(step) else "?"


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    ys = series(rows, key)[1]
    return sum(ys) / len(ys) if ys else None


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    ys = sorted(series(rows, key)[1])
    return ys[len(ys) // 2] if ys else None
