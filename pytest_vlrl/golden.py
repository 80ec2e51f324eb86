"""Golden token / loss-mask files: ``--vlrl-update-golden``, ``--vlrl-regen-all``, the ``vlrl_golden`` fixture.

- default: a differing golden fails with a token-level diff; a missing one is written and fails;
- ``--vlrl-update-golden``: differing goldens are rewritten, and those tests fail (review the diff);
- ``--vlrl-regen-all``: every golden the run checks is rewritten, and the tests pass.

At the end of a run that checked goldens, files under the golden folder that no test used are
listed in the terminal summary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

USED = pytest.StashKey[set]()
DIFFS = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vlrl")
    group.addoption(
        "--vlrl-update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files that differ, and fail those tests (like --force-regen)",
    )
    group.addoption(
        "--vlrl-regen-all",
        action="store_true",
        default=False,
        help="rewrite every golden file the run checks, and pass",
    )
    parser.addini("vlrl_golden_dir", "folder of golden files, relative to the rootdir", default="golden")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[USED] = set()


def golden_root(config: pytest.Config) -> Path:
    return Path(config.rootpath) / config.getini("vlrl_golden_dir")


class Golden:
    """``check(relative_path, text)``: compare ``text`` with the golden file, per the run's flags."""

    def __init__(self, request: pytest.FixtureRequest):
        self.config = request.config
        self.node = request.node
        self.root = golden_root(request.config)

    def check(self, relpath: str, actual: str) -> None:
        from vlrl.golden.files import golden_diff

        path = self.root / relpath
        self.config.stash[USED].add(path.resolve())
        expected = path.read_text(encoding="utf-8") if path.exists() else None
        if expected == actual:
            return
        if expected is None or self.config.getoption("vlrl_update_golden") or self.config.getoption("vlrl_regen_all"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8", newline="\n")
        if expected is None:
            pytest.fail(f"golden file {relpath} was missing: written; review it and commit it", pytrace=False)
        diff = golden_diff(expected, actual, path=path)  # a corrupt file is named by path and line
        self.node.stash[DIFFS] = f"{relpath}\n{diff}"
        if self.config.getoption("vlrl_regen_all"):
            return
        if self.config.getoption("vlrl_update_golden"):
            pytest.fail(f"golden file {relpath} rewritten; review the change:\n{diff}", pytrace=False)
        pytest.fail(
            f"golden file {relpath} differs (regenerate with `vlrl golden regen` or "
            f"--vlrl-update-golden, then read the diff):\n{diff}",
            pytrace=False,
        )


@pytest.fixture
def vlrl_golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(request)


def unused_goldens(config: pytest.Config) -> list[Path]:
    used = config.stash.get(USED, set())
    root = golden_root(config)
    if not used or not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.golden") if p.resolve() not in used)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    unused = unused_goldens(config)
    if unused:
        terminalreporter.write_sep("-", "vlrl: golden files no test used in this run")
        for path in unused:
            terminalreporter.write_line(str(path.relative_to(config.rootpath)))
