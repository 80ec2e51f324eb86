"""pytest-html extras: a training run's curves, drift histogram and rollout strips on its test's row,
and the token-level golden diff on a failing golden test's row.

    def test_color_square_learns(tmp_path, vlrl_report_extras):
        vlrl_report_extras.attach_run(tmp_path / "run")   # any time during the test, even before the run
        train(..., out=tmp_path / "run")

    attach_run(request, run_dir)                           # the same, from a helper holding `request`

The run directory is read when the test's report is made, so a run that fails halfway still shows
what it wrote. Everything here is a no-op unless pytest-html writes a report (``--html``).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import pytest

from pytest_vlrl.golden import DIFFS

RUNS = pytest.StashKey[list[Path]]()
EXTRAS = pytest.StashKey[list[dict[str, Any]]]()  # pytest-html extras
MAX_STRIP_STEPS = 2
"""Sample steps per test row (first and last): tests.html holds every test, keep each row light."""
MAX_STRIPS_PER_STEP = 3


def html_active(config: pytest.Config) -> bool:
    """Whether pytest-html is installed and writing a report in this run."""
    return bool(config.pluginmanager.hasplugin("html") and config.getoption("htmlpath", default=None))


def attach_run(request: pytest.FixtureRequest | pytest.Item, run_dir: str | Path) -> bool:
    """Show ``run_dir``'s figures and rollout strips on this test's row; ``False`` when no report is written."""
    item = request.node if isinstance(request, pytest.FixtureRequest) else request
    if not html_active(item.config):
        return False
    item.stash.setdefault(RUNS, []).append(Path(run_dir))
    return True


class ReportExtras:
    """The ``vlrl_report_extras`` fixture: attach runs, or any PNG / HTML, to the current test's row."""

    def __init__(self, item: pytest.Item):
        self.item = item
        self.active = html_active(item.config)

    def attach_run(self, run_dir: str | Path) -> bool:
        return attach_run(self.item, run_dir)

    def png(self, data: bytes, name: str = "Image") -> None:
        self._add(lambda extras: extras.png(base64.b64encode(data).decode("ascii"), name))

    def html(self, fragment: str) -> None:
        self._add(lambda extras: extras.html(fragment))

    def _add(self, make) -> None:
        if self.active:
            from pytest_html import extras

            self.item.stash.setdefault(EXTRAS, []).append(make(extras))


@pytest.fixture
def vlrl_report_extras(request: pytest.FixtureRequest) -> ReportExtras:
    return ReportExtras(request.node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not html_active(item.config):
        return
    added = item.stash.get(EXTRAS, []).copy()
    for run_dir in item.stash.get(RUNS, []):
        added += _guarded(run_extras, run_dir)
    if report.failed and item.stash.get(DIFFS, None):
        added += golden_diff_extras(item.stash[DIFFS])
    if added:
        report.extras = getattr(report, "extras", []) + added


def run_extras(run_dir: Path) -> list[dict[str, Any]]:
    """pytest-html extras for a run directory: a summary line, one PNG per figure, the rollout strips."""
    from pytest_html import extras

    from vlrl.report.runfiles import read_run
    from vlrl.report.training import figures, sample_strips

    if not Path(run_dir).is_dir():
        return [extras.html(f"<p>vlrl run <code>{html.escape(str(run_dir))}</code>: no such directory</p>")]
    run = read_run(run_dir)
    out = [extras.html(_summary_html(run))]
    out += [extras.png(base64.b64encode(png).decode("ascii"), name) for name, png in figures(run).items()]
    # frames as backgrounds, never <img>: pytest-html's media viewer takes the row's first <img> as its own
    for step, strips in sample_strips(run, MAX_STRIP_STEPS, MAX_STRIPS_PER_STEP, frame="background"):
        cards = "".join(f"<div style='flex:0 1 auto;min-width:0'>{s}</div>" for s in strips)
        out.append(
            extras.html(
                f"<div class='vlrl-rollouts'><b>rollouts at step {step}</b> (failed and solved alternate)"
                f"<div style='display:flex;flex-wrap:wrap;gap:4px 16px'>{cards}</div></div>"
            )
        )
    return out


def golden_diff_extras(diff: str) -> list[dict[str, Any]]:
    from pytest_html import extras

    return [
        extras.html(
            "<div class='vlrl-golden-diff'><b>golden diff</b>"
            f"<pre style='white-space:pre-wrap'>{html.escape(diff)}</pre></div>"
        )
    ]


def _summary_html(run) -> str:
    from vlrl.report.training import eval_change
    from vlrl.report.verdict import headline, stages_text, verdict

    s = run.summary or {}
    v = verdict(run)
    parts = [f"vlrl run <code>{html.escape(str(run.root))}</code>"]
    if v.passed is not None:
        parts.append("<b style='color:#2a7'>PASS</b>" if v.passed else "<b style='color:#c33'>FAIL</b>")
    change = html.escape(stages_text(v.stages)) if "after_sft" in dict(v.stages) else eval_change(s)
    if change:
        parts.append(f"eval reward {change}")
    if headline(v):
        parts.append(html.escape(headline(v)))
    for key in ("steps", "seconds", "passed"):
        if key in s:
            parts.append(f"{key} {html.escape(str(s[key]))}")
    parts += [html.escape(w) for w in run.warnings]
    return "<p>" + " · ".join(parts) + "</p>"


def _guarded(make, *args) -> list[dict[str, Any]]:
    """A broken run directory must not lose the test's report row: show the error instead."""
    try:
        return make(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the row, never raised into pytest's hooks
        from pytest_html import extras

        return [extras.html(f"<p>vlrl report extras failed: <code>{html.escape(repr(exc))}</code></p>")]
