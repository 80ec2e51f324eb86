"""One self-contained HTML report for a training run directory (``vlrl report RUN_DIR``).

Every image is an inline ``data:image/png`` URI and there is no script, stylesheet or font from
elsewhere, so the file can be mailed, attached to CI or opened offline. Every input file is
optional (see :mod:`vlrl.report.runfiles`): the report of a run that is still going shows what is
there so far.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from vlrl.report import plots
from vlrl.report.learning import learning_section
from vlrl.report.runfiles import RunFiles, read_run
from vlrl.report.strips import FrameTag, strip_html
from vlrl.report.verdict import VERDICT_CSS, stages_text, verdict, verdict_html

MAX_SAMPLE_STEPS = 3
"""Sample steps shown: the first (before training) and the last ones."""
MAX_SAMPLES_PER_STEP = 4

_CSS = (
    """body{font-family:system-ui,sans-serif;margin:20px;max-width:1200px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
table.kv td{padding:2px 12px 2px 0}table.kv td:first-child{color:#666}
.pass{color:#fff;background:#2a7;padding:2px 8px;border-radius:3px}
.fail{color:#fff;background:#c33;padding:2px 8px;border-radius:3px}
.warn{color:#a60}.figs img{margin:4px;border:1px solid #eee;max-width:100%;height:auto}
pre{background:#f6f6f6;padding:8px;overflow-x:auto}
table.metrics{border-collapse:collapse;font-size:13px}
table.metrics td{padding:2px 10px;border-top:1px solid #eee;vertical-align:top}
table.metrics td:first-child{color:#666;white-space:nowrap}
.samples{display:flex;gap:16px;align-items:flex-start}.samples>div{flex:1 1 0;min-width:0}
.samples h4{margin:4px 0;font-size:13px}"""
    + VERDICT_CSS
)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``<run_dir>/report.html``) and return its path."""
    run = read_run(run_dir)
    path = Path(out) if out is not None else run.root / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_html(run), encoding="utf-8")
    return path


def report_html(run: RunFiles) -> str:
    sections = [
        verdict_html(run),
        _header(run),
        _curves(run),
        learning_section(run),
        _drift(run),
        _images(run),
        _samples(run),
        _config(run),
    ]
    body = "".join(s for s in sections if s)
    name = (run.summary or {}).get("name")
    title = html.escape(f"vlrl run {name} ({run.root.name})" if isinstance(name, str) else f"vlrl run {run.root.name}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
        f"</head><body><h1>{title}</h1>{body}</body></html>"
    )


def figures(run: RunFiles) -> dict[str, bytes]:
    """The report's PNG figures by name (reused by the pytest-html extras)."""
    last = run.agreement[-1] if run.agreement else {}
    made = {
        "reward": plots.reward_curve(run),
        "loss": plots.loss_curve(run),
        "drift": plots.drift_curve(run),
        "drift histogram": plots.drift_histogram(last),
    }
    return {name: png for name, png in made.items() if png}


def sample_strips(
    run: RunFiles, max_steps: int = MAX_SAMPLE_STEPS, per_step: int = MAX_SAMPLES_PER_STEP, frame: FrameTag = "img"
) -> list[tuple[int, list[str]]]:
    """``[(step, [strip html, ...])]`` for the first and last sample steps, capped; failed and solved
    episodes alternate (:func:`pick_samples`). ``frame``: see :data:`vlrl.report.strips.FrameTag`."""
    steps = list(run.samples)
    if len(steps) > max_steps:
        steps = steps[:1] + steps[-(max_steps - 1) :] if max_steps > 1 else steps[-1:]
    return [
        (step, [strip_html(rec, frame=frame) for rec in pick_samples(run.samples[step], per_step)]) for step in steps
    ]


def episode_reward(record: dict[str, Any]) -> float:
    """A sample's return: its turns' rewards (or its per-token rewards) summed."""
    turns = record.get("turns")
    if isinstance(turns, list) and turns:
        return float(sum(t.get("reward") or 0.0 for t in turns if isinstance(t, dict)))
    return float(sum(r for r in record.get("rewards") or [] if isinstance(r, (int, float))))


def solved(record: dict[str, Any]) -> bool:
    """Solved: a positive return (as the trainer's ``eval_success``)."""
    return episode_reward(record) > 0


def pick_samples(records: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """At most ``n`` records, failed and solved alternating (failed first) while both last: a report shows
    what goes wrong beside what goes right, not only successes."""
    failed = [r for r in records if not solved(r)]
    good = [r for r in records if solved(r)]
    out: list[dict[str, Any]] = []
    while len(out) < n and (failed or good):
        for pool in (failed, good):
            if pool and len(out) < n:
                out.append(pool.pop(0))
    return out


def png_img(png: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>"


# ---------------------------------------------------------------- sections


def _header(run: RunFiles) -> str:
    s = run.summary or {}
    rows = [("run directory", f"<code>{html.escape(str(run.root))}</code>")]
    if "passed" in s:
        badge = "<span class='pass'>PASS</span>" if s["passed"] else "<span class='fail'>FAIL</span>"
        rows.append(("result", badge))
    stages = verdict(run).stages
    # with an SFT stage, the three numbers (SFT may have done all of it); else the summary's before → after
    change = html.escape(stages_text(stages)) if "after_sft" in dict(stages) else eval_change(s)
    if change:
        rows.append(("eval reward", change))
    steps = s.get("steps", _last(run, "step"))
    rows.append(("steps", _fmt(steps)))
    seconds = s.get("seconds", _last(run, "time"))
    rows.append(("time", f"{_fmt(seconds)} s" if _is_num(seconds) else "?"))
    shown = {"passed", "eval_before", "eval_after", "steps", "seconds", "name"}
    rows += [(k, html.escape(_short(v))) for k, v in s.items() if k not in shown]
    if run.summary is None:
        rows.append(("summary", "<span class='warn'>no summary.json (run still going, or it stopped early)</span>"))
    rows += [("warning", f"<span class='warn'>{html.escape(w)}</span>") for w in run.warnings]
    if run.empty:
        rows.append(("note", "<span class='warn'>nothing to report: no run files found</span>"))
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f"<table class='kv'>{table}</table>{_latest(run)}"


def eval_change(summary: dict[str, Any]) -> str:
    """The summary's eval reward before → after training as HTML; a run not evaluated before it (a maze curriculum
    level's ``eval_before`` is None unless its plan asks) shows its one number, not a made-up start. '' without
    either."""
    before, after = summary.get("eval_before"), summary.get("eval_after")
    if before is None and after is None:
        return ""
    if before is None:
        return f"<b>{_fmt(after)}</b> (not evaluated before training)"
    return f"{_fmt(before)} → <b>{_fmt(after)}</b>"


METRIC_GROUPS = (
    ("reward", ("reward_mean", "response_len", "reward_group_std", "reward_equal_group_frac")),
    ("advantages", ("adv_",)),
    ("policy update", ("loss", "clipfrac", "dual_clipfrac", "ratio_", "approx_kl", "kl")),
    ("entropy", ("entropy",)),
    ("gradients", ("grad_norm", "lr")),
    ("agreement", ("logprob_", "correction/")),
    ("time", ("time",)),
)
"""Groups of the last step's metrics table: a metric goes to the first group with a prefix it starts with."""


def metric_groups(row: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """``row``'s metrics (step and phase aside) grouped by :data:`METRIC_GROUPS`; the rest under "other"."""
    groups: dict[str, list[tuple[str, Any]]] = {name: [] for name, _ in METRIC_GROUPS}
    groups["other"] = []
    for k, v in row.items():
        if k in ("phase", "step"):
            continue
        name = next((g for g, prefixes in METRIC_GROUPS if any(k.startswith(p) for p in prefixes)), "other")
        groups[name].append((k, v))
    return [(name, items) for name, items in groups.items() if items]


def _latest(run: RunFiles) -> str:
    """The last RL (or SFT) metrics line as a grouped table, so the numbers behind the curves' ends are readable."""
    for phase in ("rl", "sft"):
        rows = run.phase(phase)
        if rows:
            body = "".join(
                f"<tr><td>{html.escape(name)}</td><td>"
                + " · ".join(f"{html.escape(k)} <b>{_fmt(v)}</b>" for k, v in items)
                + "</td></tr>"
                for name, items in metric_groups(rows[-1])
            )
            return (
                f"<h3 style='font-size:14px'>last {phase} step: step {_fmt(rows[-1].get('step'))}</h3>"
                f"<table class='metrics'>{body}</table>"
            )
    return ""


def _curves(run: RunFiles) -> str:
    imgs = [
        png_img(png, name)
        for name, png in (("reward", plots.reward_curve(run)), ("loss", plots.loss_curve(run)))
        if png
    ]
    body = "".join(imgs) or "<p class='warn'>no metrics yet (metrics.jsonl missing or empty)</p>"
    return f"<h2>Reward and loss</h2><div class='figs'>{body}</div>"


def _drift(run: RunFiles) -> str:
    if not run.agreement:
        if run.phase("sft") and not run.phase("rl"):  # agreement is checked at RL steps only
            return "<h2>Logprob drift</h2><p>SFT only: no RL step, so no rollout-vs-trainer check to show</p>"
        return "<h2>Logprob drift</h2><p class='warn'>no agreement.jsonl</p>"
    last = run.agreement[-1]
    imgs = [
        png_img(p, n) for n, p in (("drift", plots.drift_curve(run)), ("histogram", plots.drift_histogram(last))) if p
    ]
    breached = [r.get("step") for r in run.agreement if r.get("breached")]
    note = (
        f"<p class='warn'>bound breached at step(s) {html.escape(_short(breached))}</p>"
        if breached
        else f"<p>within bound at all {len(run.agreement)} logged step(s)</p>"
    )
    return (
        f"<h2>Logprob drift (rollout vs trainer)</h2>{note}<div class='figs'>{''.join(imgs)}</div>"
        f"{_where_table(run.agreement)}{_turn_table(last)}"
    )


def _where_table(rows: list[dict[str, Any]]) -> str:
    """|Δ| by context depth and by first-vs-rest token of a turn: the last step's and the worst over all steps."""
    last = rows[-1]
    groups = [("context depth (tokens before)", "by_depth"), ("position in the turn", "by_turn_position")]
    body = ""
    for title, key in groups:
        bins = [b for b in last.get(key) or [] if isinstance(b, dict)]
        if not bins:
            continue
        worst: dict[Any, float] = {}  # keyed by the rows' own bin labels
        for r in rows:
            for b in r.get(key) or []:
                if isinstance(b, dict) and _is_num(b.get("max_abs")):
                    worst[b["bin"]] = max(worst.get(b["bin"], 0.0), float(b["max_abs"]))
        body += f"<tr><td colspan='5'><b>{html.escape(title)}</b></td></tr>" + "".join(
            f"<tr><td>{_fmt(b.get('bin'))}</td><td>{_fmt(b.get('n_tokens'))}</td><td>{_fmt(b.get('mean_abs'))}</td>"
            f"<td>{_fmt(b.get('max_abs'))}</td><td>{_fmt(worst.get(b.get('bin')))}</td></tr>"
            for b in bins
        )
    if not body:
        return ""
    head = (
        f"<tr><td>bin</td><td>tokens</td><td>mean |Δ| (step {_fmt(last.get('step'))})</td><td>max |Δ|</td>"
        f"<td>max |Δ| over {len(rows)} step(s)</td></tr>"
    )
    return f"<p style='font-size:13px'>where it sits:</p><table class='kv'>{head}{body}</table>"


def _images(run: RunFiles) -> str:
    """The image-sensitivity probes (run.image_probe): does each turn's policy look at its image?"""
    if not run.image_sensitivity:
        return ""
    cells = "".join(
        f"<tr><td>{_fmt(r.get('label'))} (step {_fmt(r.get('step'))})</td><td>{_fmt(r.get('turns'))}</td>"
        f"<td>{_fmt(r.get('sensitive_fraction'))}</td><td>{_fmt(r.get('blank_mean_abs_median'))}</td>"
        f"<td>{'<span class=pass>PASS</span>' if r.get('passed') else '<span class=fail>FAIL</span>'}</td></tr>"
        for r in run.image_sensitivity
    )
    return (
        "<h2>Image sensitivity</h2><p style='font-size:13px'>each turn's generated logprobs re-scored with "
        "only that turn's image blanked or swapped (vlrl.checks.image_sensitivity); a blind policy moves "
        "nothing</p><table class='kv'><tr><td>probe</td><td>turns</td><td>sensitive fraction</td>"
        f"<td>median |Δ| blanked</td><td></td></tr>{cells}</table>"
    )


def _turn_table(row: dict[str, Any]) -> str:
    turns = [t for t in row.get("turns") or [] if isinstance(t, dict)]
    if not turns:
        return ""
    cells = "".join(
        f"<tr><td>{_fmt(t.get('turn'))}</td><td>{_fmt(t.get('max_abs'))}</td><td>{_fmt(t.get('mean_abs'))}</td></tr>"
        for t in turns
    )
    return (
        f"<p style='font-size:13px'>per turn at step {_fmt(row.get('step'))}:</p><table class='kv'>"
        f"<tr><td>turn</td><td>max |Δ|</td><td>mean |Δ|</td></tr>{cells}</table>"
    )


def _samples(run: RunFiles) -> str:
    if not run.samples:
        return "<h2>Rollouts</h2><p class='warn'>no samples/</p>"
    parts = []
    steps = [step for step, _ in sample_strips(run)]
    for step in steps:
        records = run.samples[step]
        shown = pick_samples(records, MAX_SAMPLES_PER_STEP)
        n_solved = sum(solved(r) for r in records)
        columns = "".join(
            f"<div class='{cls}'><h4>{title} ({count} of {len(records)})</h4>"
            + ("".join(strip_html(r) for r in shown if solved(r) == want) or "<p>none</p>")
            + "</div>"
            for cls, title, count, want in (
                ("solved", "solved", n_solved, True),
                ("failed", "failed", len(records) - n_solved, False),
            )
        )
        more = f" (showing {len(shown)} of {len(records)})" if len(records) > len(shown) else ""
        parts.append(f"<h3>step {step}{more}</h3><div class='samples'>{columns}</div>")
    hidden = len(run.samples) - len(parts)
    note = f"<p>{hidden} other sample step(s) not shown</p>" if hidden > 0 else ""
    return f"<h2>Rollouts</h2>{note}{''.join(parts)}"


def _config(run: RunFiles) -> str:
    if run.config_text is None:
        return ""
    return f"<h2>Config</h2><details><summary>config.toml</summary><pre>{html.escape(run.config_text)}</pre></details>"


# ---------------------------------------------------------------- formatting


def _last(run: RunFiles, key: str) -> Any:
    values = [m[key] for m in run.metrics if _is_num(m.get(key))]
    return max(values) if values else None


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fmt(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return "?" if x is None else str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.4g}" if math.isfinite(x) else str(x)
    return html.escape(_short(x))


def _short(v: Any, n: int = 200) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return text if len(text) <= n else text[: n - 1] + "…"
