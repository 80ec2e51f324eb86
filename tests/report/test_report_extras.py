"""pytest-html extras from the vlrl plugin, in a pytester sandbox: a training test's run figures and
rollout strips on its row, the golden diff on a failing golden test's row, nothing without --html."""

from __future__ import annotations

import html
import json
import re

import pytest
from report_runs import ACTIONS, make_run

HTML_ARGS = ("-p", "no:cacheprovider", "--html=out/report.html", "--self-contained-html")


def rows(pytester) -> dict[str, list[dict]]:
    """testId -> extras, read back from the data blob pytest-html 4 embeds in its report."""
    text = (pytester.path / "out" / "report.html").read_text()
    blob = re.search(r'data-jsonblob="([^"]*)"', text).group(1)
    tests = json.loads(html.unescape(blob))["tests"]
    return {
        test_id.split("::")[-1]: [x for run in runs for x in run.get("extras", [])] for test_id, runs in tests.items()
    }


def of_type(extras: list[dict], kind: str) -> list[dict]:
    return [x for x in extras if x["format_type"] == kind]


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path / "run", sample_steps=(0, 4, 8), per_step=4)


def test_attached_run_puts_figures_and_strips_on_the_row(pytester, run_dir, tmp_path):
    pytester.makepyfile(
        test_train=f"""
        def test_with_run(vlrl_report_extras):
            assert vlrl_report_extras.attach_run({str(run_dir)!r}) is True

        def test_helper_with_request(request):
            from pytest_vlrl.report import attach_run
            assert attach_run(request, {str(run_dir)!r})
            assert False, "training did not reach the threshold"

        def test_plain():
            pass

        def test_custom(vlrl_report_extras):
            vlrl_report_extras.png(b"\\x89PNG fake", "custom")
            vlrl_report_extras.html("<p>hello</p>")

        def test_missing_dir(vlrl_report_extras):
            vlrl_report_extras.attach_run({str(tmp_path / "never")!r})
    """
    )
    pytester.runpytest(*HTML_ARGS).assert_outcomes(passed=4, failed=1)
    found = rows(pytester)
    for name in ("test_with_run", "test_helper_with_request"):  # a failing run keeps its figures
        extras = found[name]
        images = of_type(extras, "image")
        assert [x["name"] for x in images] == ["reward", "loss", "drift", "drift histogram"]
        assert all(x["content"].startswith("data:image/png;base64,iVBOR") for x in images)
        fragments = " ".join(x["content"] for x in of_type(extras, "html"))
        assert "eval reward 0.25 → <b>0.95</b>" in fragments
        # first and last sample steps only, 3 trajectories each, each strip with its actions and frames
        assert re.findall(r"rollouts at step (\d+)", fragments) == ["0", "8"]
        assert fragments.count("class='vlrl-strip'") == 6
        assert (
            html.escape(ACTIONS[0]) in fragments and fragments.count("background:url(data:image/png;base64,") == 6 * 3
        )
        # pytest-html's media viewer draws its figures into the row's first <img>: an <img> in our HTML
        # took the chart (a shrunken chart over the first rollout card) and left the viewer empty
        assert "<img" not in fragments
    assert found["test_plain"] == []
    custom = found["test_custom"]
    assert [x["name"] for x in of_type(custom, "image")] == ["custom"]
    assert [x["content"] for x in of_type(custom, "html")] == ["<p>hello</p>"]
    (missing,) = found["test_missing_dir"]  # shown on the row, not raised into pytest's hooks
    assert "no such directory" in missing["content"]


def test_without_html_everything_is_a_no_op(pytester, run_dir):
    pytester.makepyfile(
        test_plain=f"""
        def test_it(vlrl_report_extras, request):
            from pytest_vlrl.report import RUNS, attach_run
            assert vlrl_report_extras.attach_run({str(run_dir)!r}) is False
            assert attach_run(request, {str(run_dir)!r}) is False
            vlrl_report_extras.png(b"x")
            assert RUNS not in request.node.stash
    """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()


GOLDEN = "---\n     0  -     42  'a'\n     1  1     43  'b'\n"
CHANGED = "---\n     0  -     42  'a'\n     1  0     43  'b'\n"


def test_failing_golden_test_gets_its_diff(pytester):
    (pytester.path / "golden").mkdir()
    (pytester.path / "golden" / "case.golden").write_text(GOLDEN)
    pytester.makepyfile(
        test_gold=f"""
        def test_differs(vlrl_golden):
            vlrl_golden.check("case.golden", {CHANGED!r})

        def test_same(vlrl_golden):
            vlrl_golden.check("case.golden", {GOLDEN!r})

        def test_other_failure():
            assert 1 == 2
    """
    )
    pytester.runpytest(*HTML_ARGS).assert_outcomes(passed=1, failed=2)
    found = rows(pytester)
    (diff,) = of_type(found["test_differs"], "html")
    assert "class='vlrl-golden-diff'" in diff["content"]
    assert "case.golden" in diff["content"] and "loss-mask changes at 1 tokens" in diff["content"]
    assert "golden-&gt;now" in diff["content"] and "->" not in diff["content"]  # escaped, not raw HTML
    assert found["test_same"] == [] and found["test_other_failure"] == []


def test_regen_all_golden_pass_gets_no_diff(pytester):
    (pytester.path / "golden").mkdir()
    (pytester.path / "golden" / "case.golden").write_text(GOLDEN)
    pytester.makepyfile(
        test_gold=f"""
        def test_differs(vlrl_golden):
            vlrl_golden.check("case.golden", {CHANGED!r})
    """
    )
    pytester.runpytest(*HTML_ARGS, "--vlrl-regen-all").assert_outcomes(passed=1)
    assert rows(pytester)["test_differs"] == []
