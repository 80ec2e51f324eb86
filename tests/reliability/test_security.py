"""Security of data-driven env construction: a dataset row cannot make gymnasium import a module,
and the extras it passes to ``gymnasium.make`` are only what the adapter documents."""

from __future__ import annotations

import sys

import pytest

from vlrl.envs import EnvError, env_from_row

CANARY = "vlrl_reliability_canary_module"
KEYWORDS = {"left": 0, "right": 1}


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """An importable module that records being imported (a row must never cause that)."""
    (tmp_path / f"{CANARY}.py").write_text("import builtins\nbuiltins.vlrl_canary_imported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop(CANARY, None)
    import builtins

    assert not getattr(builtins, "vlrl_canary_imported", False), "a dataset row imported a module"


@pytest.mark.parametrize(
    "env_class", [f"gym/{CANARY}:Nope-v0", f"gym/{CANARY}:CartPole-v1", f"gym/{CANARY}.sub:Nope-v0"]
)
def test_a_row_cannot_import_a_module(canary, env_class):
    with pytest.raises(EnvError, match="'module:' prefix"):
        env_from_row({"env_class": env_class, "extras": {"keywords": KEYWORDS}, "seed": 0})
    assert CANARY not in sys.modules


def test_a_row_cannot_name_an_id_gymnasium_does_not_know():
    with pytest.raises(EnvError, match="not in gymnasium's registry"):
        env_from_row({"env_class": "gym/NoSuchEnv-v0", "extras": {"keywords": KEYWORDS}, "seed": 0})


@pytest.mark.parametrize(
    "extras, needle",
    [
        ({"keywords": KEYWORDS, "entry_point": "os:system"}, "unknown extras ['entry_point']"),
        ({"keywords": KEYWORDS, "make_kwargs": {"render_mode": "human"}}, "may not set 'render_mode'"),
        ({"keywords": KEYWORDS, "make_kwargs": {"max_episode_steps": 10**9}}, "may not set 'max_episode_steps'"),
        ({"keywords": KEYWORDS, "make_kwargs": {"disable_env_checker": True}}, "may not set 'disable_env_checker'"),
        ({"keywords": KEYWORDS, "make_kwargs": {"not an identifier": 1}}, "may not set"),
        ({"keywords": KEYWORDS, "make_kwargs": [1]}, "must be a JSON object"),
        ({"keywords": {"left": "os.system"}}, "integer action ids"),
        ({"keywords": KEYWORDS, "max_turns": 10**9}, "max_turns"),
        ({"keywords": KEYWORDS, "prompt": {"role": "system"}}, "prompt"),
    ],
)
def test_extras_are_restricted_to_what_the_adapter_documents(extras, needle):
    with pytest.raises(EnvError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        env_from_row({"env_class": "gym/CartPole-v1", "extras": extras, "seed": 0})


def test_registered_gym_envs_take_only_max_turns():
    with pytest.raises(EnvError, match="unknown extras"):
        env_from_row({"env_class": "gym/FrozenLake-v1", "extras": {"make_kwargs": {"desc": ["SH"]}}, "seed": 0})
    env = env_from_row({"env_class": "gym/FrozenLake-v1", "extras": {"max_turns": 3}, "seed": 0})
    assert env.max_turns == 3


def test_documented_extras_still_work():
    env = env_from_row(
        {
            "env_class": "gym/CartPole-v1",
            "seed": 0,
            "extras": {
                "keywords": KEYWORDS,
                "prompt": "Balance the pole.",
                "max_turns": 2,
                "make_kwargs": {"sutton_barto_reward": True},
            },
        }
    )
    messages, _ = env.init(None)
    assert "Balance the pole." in messages[0]["content"][1]["text"] and env.max_turns == 2
    env.close()
