"""The pieces of user goldens: the public Scenario spec, loading a scenarios module, `vlrl golden --scenarios`,
and the plugin (fix text, built-ins never listed as unused in a user's project). End to end: tests/frontdoor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vlrl.cli import main
from vlrl.golden import Scenario, ScenarioError, load_scenarios
from vlrl.golden.user import module_of, regen_command

ROOT = Path(__file__).resolve().parents[2]

MODULE = """
from vlrl.golden import Scenario

SCENARIOS = [
    Scenario("square_red", env="color_square", actions=("<answer>red</answer>",), seed=7),
    Scenario("square_two", env="color_square", actions=["red", "blue"], seed=1, extras={"n_turns": 2}),
]
"""


def test_scenario_spec_is_checked_and_normalised():
    sc = Scenario("a.b-1", env="m:f", actions=["x", "y"], stop="</a>", extras={"k": 1})
    assert sc.actions == ("x", "y") and sc.stop == ("</a>",) and sc.arch == "qwen2_5_vl"
    assert str(sc) == "a.b-1" and sc.relpath == "qwen2_5_vl/a.b-1.golden"
    with pytest.raises(TypeError):
        sc.extras["k"] = 2  # type: ignore[index]
    assert Scenario("s", env="m:f", actions="one").actions == ("one",)
    for kwargs, words in [
        ({"name": "../x"}, "name '../x'"),
        ({"actions": ()}, "non-empty sequence"),
        ({"actions": (1,)}, "non-empty sequence"),
        ({"arch": "llava"}, "arch 'llava' is not one of"),
        ({"env": " "}, "env must be"),
    ]:
        args = {"name": "s", "env": "m:f", "actions": ("a",), **kwargs}
        with pytest.raises(ScenarioError, match=words):
            Scenario(**args)


def test_load_scenarios_names_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "good_sc.py").write_text(MODULE)
    (tmp_path / "empty_sc.py").write_text("X = 1\n")
    (tmp_path / "bad_sc.py").write_text("SCENARIOS = ['square_red']\n")
    (tmp_path / "dup_sc.py").write_text(
        "from vlrl.golden import Scenario\nSCENARIOS = [Scenario('a', env='e', actions='x')] * 2\n"
    )
    good = load_scenarios("good_sc")
    assert [s.name for s in good] == ["square_red", "square_two"]
    assert module_of(good[1]) == "good_sc"
    assert module_of(Scenario("x", env="e", actions="a")) is None
    for module, words in [
        ("no_such_sc", "cannot import it"),
        ("empty_sc", "has no SCENARIOS"),
        ("bad_sc", r"SCENARIOS\[0\] is a str"),
        ("dup_sc", "two scenarios are named 'a'"),
    ]:
        with pytest.raises(ScenarioError, match=words):
            load_scenarios(module)


def test_regen_and_check_with_scenarios_touch_only_that_modules_files(tmp_path, monkeypatch, vlrl_model_dir, capsys):
    vlrl_model_dir("qwen2_5_vl")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "cli_sc.py").write_text(MODULE)
    assert main(["golden", "regen", "--scenarios", "cli_sc", "--only", "square_red"]) == 0
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.golden"))
    assert files == ["golden/qwen2_5_vl/square_red.golden"]
    text = (tmp_path / files[0]).read_text()
    assert "regenerate with `vlrl golden regen --scenarios <module> --only square_red`" in text
    # the same episode as the built-in single_image scenario (color_square, seed 7, same answer): same tokens
    builtin = (ROOT / "golden/qwen2_5_vl/single_image.golden").read_text()
    assert text.split("---\n", 1)[1] == builtin.split("---\n", 1)[1]

    assert main(["golden", "check", "--scenarios", "cli_sc"]) == 1  # square_two is missing
    out = capsys.readouterr().out
    assert "square_two.golden: missing" in out and "fix: vlrl golden regen --scenarios cli_sc --only square_two" in out
    assert main(["golden", "regen", "--scenarios", "cli_sc", "--dir", "pins"]) == 0
    assert sorted(p.name for p in (tmp_path / "pins").rglob("*.golden")) == ["square_red.golden", "square_two.golden"]
    assert main(["golden", "check", "--scenarios", "cli_sc", "--dir", "pins"]) == 0
    target = tmp_path / "pins/qwen2_5_vl/square_two.golden"
    target.write_text(re.sub(r"(?m)^(\s+\d+)  1  ", r"\1  0  ", target.read_text(), count=1))  # one mask flip
    assert main(["golden", "check", "--scenarios", "cli_sc", "--dir", "pins"]) == 1
    out = capsys.readouterr().out
    assert "loss-mask changes at 1 tokens" in out
    assert "fix: vlrl golden regen --scenarios cli_sc --only square_two --dir pins" in out
    assert main(["golden", "list", "--scenarios", "cli_sc"]) == 0
    assert "square_two" in capsys.readouterr().out


def test_cli_refuses_mixed_or_unknown_picks_and_builtins_outside_the_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mix_sc.py").write_text(MODULE)
    assert main(["golden", "regen", "--scenarios", "mix_sc", "--only", "nope"]) == 2
    assert "--only nope: not in mix_sc.SCENARIOS (square_red, square_two)" in capsys.readouterr().err
    assert main(["golden", "regen", "--scenarios", "mix_sc", "--scenario", "single_image"]) == 2
    assert "pick yours with --only NAME" in capsys.readouterr().err
    assert main(["golden", "regen", "--only", "square_red"]) == 2
    assert main(["golden", "regen"]) == 2
    assert "vlrl golden regen --scenarios MODULE" in capsys.readouterr().err
    assert not (tmp_path / "golden").exists()


def test_builtins_default_to_the_checkout_only_inside_it(tmp_path, monkeypatch):
    from vlrl.golden.cli import builtin_dir

    monkeypatch.chdir(ROOT / "tests")
    assert builtin_dir(None) == ROOT / "golden"
    assert builtin_dir(str(tmp_path)) == tmp_path
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError.__mro__[1], match="--scenarios MODULE"):
        builtin_dir(None)


def test_regen_command_text():
    assert regen_command("m", "n") == "vlrl golden regen --scenarios m --only n"
    assert regen_command(None, "n", "g2") == "vlrl golden regen --scenarios <your scenarios module> --only n --dir g2"


PLUGIN_TEST = """
def test_it(vlrl_golden):
    vlrl_golden.check("arch/case.golden", "---\\n     0  -     42  'b'\\n")

def test_named(vlrl_golden):
    vlrl_golden.check("arch/case.golden", "---\\n     0  -     42  'c'\\n", fix="`make goldens`")
"""


def test_plugin_names_the_fix_and_never_lists_vlrls_builtins_as_unused(pytester):
    pytester.makepyfile(test_case=PLUGIN_TEST)
    arch = pytester.path / "golden" / "arch"
    arch.mkdir(parents=True)
    (arch / "case.golden").write_text("---\n     0  -     42  'a'\n")
    (arch / "stale.golden").write_text("---\n")
    builtin = pytester.path / "golden" / "qwen2_vl"
    builtin.mkdir()
    (builtin / "single_image.golden").write_bytes((ROOT / "golden/qwen2_vl/single_image.golden").read_bytes())
    (builtin / "maze2d_multi_turn.golden").write_text("# something else under a built-in's name\n---\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*golden file arch/case.golden differs; if the change is intended, rewrite it with "
            "`pytest --vlrl-update-golden 'test_case.py::test_it'` and read the diff*",
            "*golden file arch/case.golden differs; if the change is intended, rewrite it with `make goldens`*",
        ]
    )
    unused = result.stdout.str().split("no test used in this run")[1].split("short test summary")[0]
    assert "golden/arch/stale.golden" in unused and "golden/qwen2_vl/maze2d_multi_turn.golden" in unused
    assert "single_image" not in unused and "case.golden" not in unused
