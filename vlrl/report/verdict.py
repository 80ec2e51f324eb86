"""The verdict strip at the top of a run's report: did the run pass, and what did SFT and RL each do?

- **criteria**: the pass criteria of :mod:`vlrl.checks.training` that the run's files can answer —
  logprob agreement held at every RL step, every image-sensitivity probe passed (when ``run.image_probe``),
  the final eval reached ``run.stop_at`` (when set) — each PASS or FAIL with the check's own message;
- **eval reward by stage**: before training → after SFT → after RL, so a run where SFT did all of the
  learning says so instead of "0 → 1";
- **RL's own gain**: eval success after RL minus after SFT (before, without SFT), with a 95 % interval:
  Newcombe's hybrid score interval for a difference of two proportions, built from each rate's Wilson
  interval over the eval episodes (``data.eval_rows``, one episode per row). The two evaluations replay
  the same seeds, so they are paired; the unpaired interval ignores that and is the wider, cautious one;
- **agreement**: the worst rollout-vs-trainer max |Δ| over the RL steps against its bound
  (:mod:`vlrl.checks.bounds`, logged with every step).

Light module: no torch, no matplotlib.
"""

from __future__ import annotations

import html
import math
import tomllib
from dataclasses import dataclass
from typing import Any, Literal

from vlrl.checks.training import RunRecord, TrainingCheckError, agreement_held, images_mattered, learned
from vlrl.report.runfiles import RunFiles

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Gain:
    """RL's change of eval success (a fraction), from ``start`` (after SFT, or before) to after RL."""

    start_label: Literal["after_sft", "before"]
    start: float
    end: float
    n: int | None
    low: float | None
    high: float | None

    @property
    def delta(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Verdict:
    criteria: tuple[Criterion, ...]
    unjudged: tuple[str, ...]
    stages: tuple[tuple[str, float], ...]  # (label, eval reward mean) in run order: before, after_sft, after
    gain: Gain | None
    agreement_worst: float | None
    agreement_bound: float | None
    agreement_step: int | None

    @property
    def passed(self) -> bool | None:
        return all(c.passed for c in self.criteria) if self.criteria else None


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n``."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(p1: float, p2: float, n1: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval of ``p2 − p1`` (Newcombe 1998, method 10: from the two Wilson intervals)."""
    l1, u1 = wilson(p1 * n1, n1, z)
    l2, u2 = wilson(p2 * n2, n2, z)
    d = p2 - p1
    low = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return max(-1.0, low), min(1.0, high)


def _config(run: RunFiles) -> dict[str, Any]:
    if not run.config_text:
        return {}
    try:
        return tomllib.loads(run.config_text)
    except tomllib.TOMLDecodeError:
        return {}


def verdict(run: RunFiles) -> Verdict:
    cfg = _config(run)
    record = RunRecord(run.root, run.summary or {}, run.metrics, run.agreement, run.image_sensitivity)
    criteria: list[Criterion] = []

    def check(name: str, fn, *args, ok: str) -> None:
        try:
            fn(record, *args)
        except TrainingCheckError as exc:
            criteria.append(Criterion(name, False, str(exc)))
        except (KeyError, TypeError):  # rows without the fields the check reads: not judged, rather than guessed
            return
        else:
            criteria.append(Criterion(name, True, ok))

    if run.phase("rl") or run.agreement:
        check("agreement held", agreement_held, ok=f"within bound at all {len(run.agreement)} RL step(s)")
    if run.image_sensitivity:
        check("images mattered", images_mattered, ok=f"all {len(run.image_sensitivity)} probe(s) passed")
    stop_at = (cfg.get("run") or {}).get("stop_at")
    unjudged = []
    if isinstance(stop_at, (int, float)) and run.phase("eval"):
        check(f"learned (eval ≥ {stop_at:g})", learned, float(stop_at), ok="final eval reached run.stop_at")
    elif run.phase("eval"):
        unjudged.append("learning: no threshold (run.stop_at unset); read the eval reward by stage")

    evals = [e for e in run.phase("eval") if _num(e.get("eval_reward_mean"))]
    by_label: dict[str, dict[str, Any]] = {}
    for e in evals:  # the last of each label (a resumed run may log one twice)
        by_label[str(e.get("label"))] = e
    stages = tuple(
        (lab, float(by_label[lab]["eval_reward_mean"])) for lab in ("before", "after_sft", "after") if lab in by_label
    )

    gain = None
    start_label: Literal["after_sft", "before"] = "after_sft" if "after_sft" in by_label else "before"
    if "after" in by_label and start_label in by_label and run.phase("rl"):
        a, b = by_label[start_label], by_label["after"]
        if _num(a.get("eval_success")) and _num(b.get("eval_success")):
            n = (cfg.get("data") or {}).get("eval_rows")
            low = high = None
            if isinstance(n, int) and n > 0:
                low, high = newcombe_difference(float(a["eval_success"]), float(b["eval_success"]), n, n)
            gain = Gain(
                start_label,
                float(a["eval_success"]),
                float(b["eval_success"]),
                n if isinstance(n, int) else None,
                low,
                high,
            )

    worst = max((r for r in run.agreement if _num(r.get("max_abs"))), key=lambda r: r["max_abs"], default=None)
    return Verdict(
        tuple(criteria),
        tuple(unjudged),
        stages,
        gain,
        float(worst["max_abs"]) if worst else None,
        float(worst["bound"]) if worst and _num(worst.get("bound")) else None,
        int(worst["step"]) if worst and _num(worst.get("step")) else None,
    )


_NAMES = {"before": "before", "after_sft": "after SFT", "after": "after RL"}


def stages_text(stages: tuple[tuple[str, float], ...]) -> str:
    """``before 0.000 → after SFT 1.000 → after RL 1.000`` (plain text)."""
    return " → ".join(f"{_NAMES.get(label, label)} {value:.3f}" for label, value in stages)


def headline(v: Verdict) -> str:
    """Which stage moved the eval reward, in words: never "0 → 1" when SFT did all of it."""
    d = dict(v.stages)
    if "before" not in d or "after" not in d:
        return ""
    total = d["after"] - d["before"]
    if "after_sft" in d:
        sft, rl = d["after_sft"] - d["before"], d["after"] - d["after_sft"]
        return f"eval reward {total:+.3f} overall: SFT {sft:+.3f}, RL {rl:+.3f}"
    return f"eval reward {total:+.3f}, all from RL (no SFT)"


def verdict_html(run: RunFiles) -> str:
    """The strip: ``<div class='vlrl-verdict'>`` with ``data-*`` attributes carrying its numbers."""
    v = verdict(run)
    if not v.criteria and not v.stages and v.agreement_worst is None:
        return ""
    if v.passed is None:
        badge = "<span class='warn'>no criteria to judge</span>"
    else:
        badge = "<span class='pass'>PASS</span>" if v.passed else "<span class='fail'>FAIL</span>"
    count = f" {sum(c.passed for c in v.criteria)} of {len(v.criteria)} criteria" if v.criteria else ""
    rows = [f"<div class='vv-badge' data-passed='{str(v.passed).lower()}'>{badge}{count}</div>"]
    if v.criteria:
        items = "".join(
            f"<li data-criterion='{html.escape(c.name)}' data-passed='{str(c.passed).lower()}'>"
            f"{'✓' if c.passed else '✗'} <b>{html.escape(c.name)}</b>: {html.escape(c.detail)}</li>"
            for c in v.criteria
        )
        items += "".join(f"<li class='vv-unjudged'>– not judged: {html.escape(u)}</li>" for u in v.unjudged)
        rows.append(f"<ul class='vv-criteria'>{items}</ul>")
    cells = []
    if v.stages:
        data = " ".join(f"data-{lab.replace('_', '-')}='{val:.6g}'" for lab, val in v.stages)
        cells.append(
            f"<div class='vv-cell vv-stages' {data}><div class='vv-k'>eval reward</div>"
            f"<div class='vv-v'>{html.escape(stages_text(v.stages))}</div>"
            f"<div class='vv-note'>{html.escape(headline(v))}</div></div>"
        )
    if v.gain is not None:
        g = v.gain
        interval = (
            f"95 % interval [{g.low:+.3f}, {g.high:+.3f}] over {g.n} eval episodes (Newcombe–Wilson, unpaired)"
            if g.low is not None and g.high is not None
            else "no interval: data.eval_rows not in config.toml"
        )
        attrs = f"data-gain='{g.delta:.6g}'" + (
            f" data-low='{g.low:.6g}' data-high='{g.high:.6g}'" if g.low is not None else ""
        )
        cells.append(
            f"<div class='vv-cell vv-gain' {attrs}><div class='vv-k'>RL's own gain (eval success, from "
            f"{_NAMES[g.start_label]})</div><div class='vv-v'>{g.delta:+.3f}</div>"
            f"<div class='vv-note'>{html.escape(interval)}</div></div>"
        )
    if v.agreement_worst is not None:
        bound = v.agreement_bound
        within = bound is None or v.agreement_worst <= bound
        ratio = f"{v.agreement_worst / bound:.2g}× the bound" if bound else ""
        cells.append(
            f"<div class='vv-cell vv-agree' data-worst='{v.agreement_worst:.6g}' "
            f"data-bound='{bound if bound is not None else ''}'>"
            f"<div class='vv-k'>agreement worst max |Δ|</div><div class='vv-v {'' if within else 'warn'}'>"
            f"{v.agreement_worst:.2e} vs bound {bound if bound is None else f'{bound:.1e}'}</div>"
            f"<div class='vv-note'>step {v.agreement_step} · {ratio}</div></div>"
        )
    rows.append(f"<div class='vv-cells'>{''.join(cells)}</div>")
    return f"<div class='vlrl-verdict' data-passed='{str(v.passed).lower()}'>{''.join(rows)}</div>"


VERDICT_CSS = (
    ".vlrl-verdict{border:2px solid #ccc;border-radius:6px;padding:10px 14px;margin:10px 0 18px 0;background:#fafafa}"
    ".vlrl-verdict[data-passed=true]{border-color:#2a7}.vlrl-verdict[data-passed=false]{border-color:#c33}"
    ".vv-badge{font-size:18px;margin-bottom:6px}.vv-criteria{margin:4px 0 8px 0;padding-left:18px;font-size:13px}"
    ".vv-cells{display:flex;flex-wrap:wrap;gap:12px}.vv-cell{flex:1 1 260px;background:#fff;border:1px solid #e3e3e3;"
    "border-radius:4px;padding:6px 10px}.vv-k{font-size:12px;color:#666}.vv-v{font-size:16px;font-weight:600}"
    ".vv-note{font-size:12px;color:#555}"
)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
