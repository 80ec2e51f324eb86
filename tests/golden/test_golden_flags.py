"""The plugin's golden flags, run in a pytester sandbox: default, --vlrl-update-golden, --vlrl-regen-all."""

from __future__ import annotations

import pytest

GOLDEN = "---\n     0  -     42  'a'\n     1  1     43  'b'\n"
CHANGED = "---\n     0  -     42  'a'\n     1  0     43  'b'\n"
TEST = f"""
def test_it(vlrl_golden):
    vlrl_golden.check("arch/case.golden", {CHANGED!r})
"""


@pytest.fixture
def sandbox(pytester):
    pytester.makepyfile(test_case=TEST)
    (pytester.path / "golden" / "arch").mkdir(parents=True)
    (pytester.path / "golden" / "arch" / "case.golden").write_text(GOLDEN)
    (pytester.path / "golden" / "arch" / "stale.golden").write_text(GOLDEN)
    return pytester


def golden_text(pytester) -> str:
    return (pytester.path / "golden" / "arch" / "case.golden").read_text()


def test_a_difference_fails_with_a_token_diff_and_keeps_the_file(sandbox):
    result = sandbox.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden file arch/case.golden differs*", "*loss-mask changes at 1 tokens*1 1->0*"])
    assert golden_text(sandbox) == GOLDEN


def test_update_rewrites_then_fails(sandbox):
    result = sandbox.runpytest("-p", "no:cacheprovider", "--vlrl-update-golden")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden file arch/case.golden rewritten; review the change*"])
    assert golden_text(sandbox) == CHANGED
    sandbox.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_regen_all_rewrites_and_passes(sandbox):
    sandbox.runpytest("-p", "no:cacheprovider", "--vlrl-regen-all").assert_outcomes(passed=1)
    assert golden_text(sandbox) == CHANGED


def test_missing_golden_is_written_and_fails(sandbox):
    (sandbox.path / "golden" / "arch" / "case.golden").unlink()
    result = sandbox.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden file arch/case.golden was missing: written*"])
    assert golden_text(sandbox) == CHANGED


def test_unused_goldens_are_reported(sandbox):
    result = sandbox.runpytest("-p", "no:cacheprovider", "--vlrl-regen-all")
    result.stdout.fnmatch_lines(["*vlrl: golden files no test used in this run*", "golden/arch/stale.golden"])
    assert "case.golden" not in result.stdout.str().split("no test used")[1]
