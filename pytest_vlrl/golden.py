"""Golden token / loss-mask files: ``--vlrl-update-golden``, ``--vlrl-regen-all``, the ``vlrl_golden`` fixture.

- default: a differing golden fails with a token-level diff; a missing one is written and fails;
- ``--vlrl-update-golden``: differing goldens are rewritten, and those tests fail (review the diff);
- ``--vlrl-regen-all``: every golden the run checks is rewritten, and the tests pass.

At the end of a run that checked goldens, files under the golden folder that no test used are
listed in the terminal summary (outside vlrl's checkout, vlrl's own built-in goldens are not: they
belong to vlrl, and are only counted).

Your project's scenarios (:class:`vlrl.golden.Scenario`)::

    @pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
    def test_golden(vlrl_golden, scenario):
        vlrl_golden.check_scenario(scenario)

A differing file fails naming the command that rewrites that one file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

USED = pytest.StashKey[set]()
DIFFS = pytest.StashKey[str]()
RENDERERS = pytest.StashKey[dict]()


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

    def check_scenario(self, scenario) -> None:
        """Play ``scenario`` (a :class:`vlrl.golden.Scenario`) and compare it with ``<golden>/<arch>/<name>.golden``."""
        from vlrl.golden.user import Scenario, module_of, regen_command, render_user_scenario, renderer_for

        if not isinstance(scenario, Scenario):
            raise TypeError(f"check_scenario takes a vlrl.golden.Scenario, not a {type(scenario).__name__}")
        renderers = self.config.stash.setdefault(RENDERERS, {})
        if scenario.arch not in renderers:
            renderers[scenario.arch] = renderer_for(scenario.arch, self.config.getoption("vlrl_model_cache"))
        renderer, context = renderers[scenario.arch]
        folder = self.config.getini("vlrl_golden_dir")
        module = module_of(scenario)
        fix = f"`{regen_command(module, scenario.name, folder)}` or `{self.pytest_fix()}`"
        self.check(scenario.relpath, render_user_scenario(scenario, renderer, context), fix=fix)

    def pytest_fix(self) -> str:
        return f"pytest --vlrl-update-golden '{self.node.nodeid}'"

    def check(self, relpath: str, actual: str, fix: str | None = None) -> None:
        """``fix``: the command(s) that rewrite this file, named when it differs (default: the pytest flag
        on this test)."""
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
            f"golden file {relpath} differs; if the change is intended, rewrite it with "
            f"{fix or '`' + self.pytest_fix() + '`'} and read the diff:\n{diff}",
            pytrace=False,
        )


@pytest.fixture
def vlrl_golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(request)


def unused_goldens(config: pytest.Config) -> list[Path]:
    """Golden files no test of this run used; outside vlrl's checkout, vlrl's own built-ins are left out."""
    used = config.stash.get(USED, set())
    root = golden_root(config)
    if not used or not root.is_dir():
        return []
    unused = sorted(p for p in root.rglob("*.golden") if p.resolve() not in used)
    if in_vlrl_checkout(config):
        return unused
    return [p for p in unused if not is_builtin_golden(p)]


def in_vlrl_checkout(config: pytest.Config) -> bool:
    import vlrl

    return Path(config.rootpath).resolve() == Path(vlrl.__file__).resolve().parents[1]


def is_builtin_golden(path: Path) -> bool:
    """A file of vlrl's own scenarios (``<arch>/<name>.golden`` with the built-in header), e.g. one an old
    ``vlrl golden regen`` wrote into a user's folder."""
    from vlrl.golden.scenarios import SCENARIOS

    sc = SCENARIOS.get(path.stem)
    if sc is None:
        return False
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return False
    return first == f"# vlrl golden file: {path.parent.name} / {sc.name} — {sc.description}"


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    unused = unused_goldens(config)
    if unused:
        terminalreporter.write_sep("-", "vlrl: golden files no test used in this run")
        for path in unused:
            terminalreporter.write_line(str(path.relative_to(config.rootpath)))
