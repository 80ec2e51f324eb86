"""``data.env=module:factory`` (and ``--env``, ``sft.expert``): imported by the config or command line only,
never by a dataset row; extras checked against the factory's signature before anything runs."""

from __future__ import annotations

import sys

import pytest

from vlrl.cli import main
from vlrl.envs import EnvError, env_from_row, make_env
from vlrl.envs.registry import ENVS, KeywordFactory, _from_entry_point
from vlrl.errors import ConfigError
from vlrl.registry import DuplicateNameError, Registry
from vlrl.train.config import load_config

SMALL = ["data.extras={}", "sft.steps=0"]  # the color_square recipe's square_sizes are not this env's


def test_a_module_factory_env_is_resolved_by_the_config_and_rows_carry_it(user_env):
    target = f"{user_env}:make_env"
    assert user_env not in sys.modules
    cfg = load_config("color_square", [f"data.env={target}", *SMALL])
    assert cfg.data.env == target and target in ENVS
    env = env_from_row({"env_class": target, "extras": {"dot": 8}, "seed": 3})  # a row names it, already imported
    messages, info = env.init(None)
    assert info["answer"] in ("nw", "ne", "sw", "se")
    assert env.step(info["answer"]).reward == 1.0


def test_a_row_cannot_import_a_module(user_env):
    target = f"{user_env}:make_env"
    with pytest.raises(EnvError, match=r"a dataset row may not import.*data\.env="):
        env_from_row({"env_class": target, "extras": {}, "seed": 0})
    assert user_env not in sys.modules  # refused before any import
    with pytest.raises(EnvError, match="may not import"):
        make_env("os:system", {}, 0)


def test_extras_the_factory_cannot_take_fail_at_config_time_naming_both(user_env):
    target = f"{user_env}:make_env"
    with pytest.raises(ConfigError) as info:  # the recipe's square_sizes, leaked into a user's env
        load_config("color_square", [f"data.env={target}", "sft.steps=0"])
    text = str(info.value)
    assert "square_sizes" in text and f"{target}(seed, ...)" in text and "size, dot" in text
    assert "\n" not in text
    load_config("color_square", [f"data.env={target}", "data.extras={'dot': 6}", "sft.steps=0"])  # a real one


def test_bad_targets_are_config_errors(user_env):
    cases = {
        "no_such_module_xyz:make_env": "cannot import 'no_such_module_xyz'",
        f"{user_env}:nothing_here": f"module '{user_env}' has no 'nothing_here'",
        f"{user_env}:ANSWERS": "not callable",
    }
    for target, words in cases.items():
        with pytest.raises(ConfigError, match=words):
            load_config("color_square", [f"data.env={target}", *SMALL])


def test_a_user_expert_is_given_as_module_fn(user_env):
    target = f"{user_env}:make_env"
    with pytest.raises(ConfigError, match=r"sft\.expert.*module:fn"):  # no expert goes by a module's name
        load_config("color_square", [f"data.env={target}", "data.extras={}", "sft.expert="])
    cfg = load_config("color_square", [f"data.env={target}", "data.extras={}", f"sft.expert={user_env}:expert"])
    from vlrl.train.experts import expert_for

    env = make_env(target, {}, 5)
    _, info = env.init(None)
    assert list(expert_for(cfg.sft.expert)(env, {"seed": 5})) == [info["answer"]]


def test_dataset_and_rollout_take_module_factory(user_env, tmp_path, capsys):
    from vlrl.data.rows import read_rows

    target = f"{user_env}:make_env"
    out = tmp_path / "data"
    argv = ["dataset", "--env", target, "--train", "2", "--eval", "2", "--out", str(out), "--train-seed", "1"]
    assert main(argv) == 0
    assert {r.env_class for r in read_rows(out / "eval.parquet")} == {target}
    assert main(["dataset", "--env", target, "--extras", '{"square_sizes": [4]}', "--out", str(out)]) == 2
    assert "square_sizes" in capsys.readouterr().err

    import argparse

    from vlrl.rollout.cli import rows_of

    ENVS.remove(target)  # a fresh process: the rows alone cannot bring the module in, --env can
    args = argparse.Namespace(env=target, extras={}, rows=2, data=str(out / "eval.parquet"))
    assert [r.env_class for r in rows_of(args)] == [target, target]
    assert target in ENVS


def write_dist(root, entry_points: str) -> None:
    """An installed package's metadata; vlrl's own registry loads its entry points first, so it never sees these."""
    from vlrl.envs import registered_envs

    registered_envs()
    dist = root / "quadpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: quadpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_the_entry_point_group_files_factories_lazily_and_imports_modules(user_env, tmp_path):
    # user_env put tmp_path on sys.path: importlib.metadata finds the .dist-info there, as after `pip install`
    registrar = tmp_path / f"{user_env}_reg.py"
    registrar.write_text("IMPORTED = True\n")
    write_dist(tmp_path, f"[vlrl.envs]\nquadrant_x = {user_env}:make_env\nreg = {user_env}_reg\n")
    family: Registry = Registry("env_class")
    assert family.add_entry_points("vlrl.envs", _from_entry_point) == ["quadrant_x"]
    assert f"{user_env}_reg" in sys.modules  # a module entry point: imported for its own registrations
    factory = family.get("quadrant_x")
    assert isinstance(factory, KeywordFactory) and user_env not in sys.modules  # lazy until first made
    env = factory({"dot": 6}, 2)
    assert env.init(None)[1]["answer"] in ("nw", "ne", "sw", "se")
    with pytest.raises(EnvError, match=r"\['bogus'\] are not parameters"):
        factory({"bogus": 1}, 2)
    with pytest.raises(DuplicateNameError, match="quadpkg"):  # an entry point cannot shadow a registered name
        family.add_entry_points("vlrl.envs", _from_entry_point)
    sys.modules.pop(f"{user_env}_reg", None)


def test_a_broken_entry_point_names_itself(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_dist(tmp_path, "[vlrl.envs]\nbroken = no_such_pkg_xyz.env:make_env\n")
    family: Registry = Registry("env_class")
    family.add_entry_points("vlrl.envs", _from_entry_point)  # lazy: nothing imported yet
    with pytest.raises(EnvError, match=r"entry point vlrl\.envs:broken = 'no_such_pkg_xyz.env:make_env' of quadpkg"):
        family.get("broken")({}, 0)
