"""gym/<id>: the shipped configurations and a gymnasium env registered on the fly."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

from vlrl.envs import EnvError, make_env, unregister_env
from vlrl.envs.gym_adapter import SHIPPED, GymEnvConfig, register_gym_env
from vlrl.messages import load_image

FRAME_SIZES = {"FrozenLake-v1": (256, 256), "CliffWalking-v1": (768, 256), "Taxi-v4": (536, 456)}  # (w, h)


@pytest.mark.parametrize("gym_id", sorted(SHIPPED))
def test_shipped_config_plays(gym_id):
    env = make_env(f"gym/{gym_id}", {}, 0)
    messages, info = env.init(None)
    assert info["seed"] == 0 and env.max_turns == SHIPPED[gym_id].max_turns
    assert load_image(messages[0]["content"][0]).size == FRAME_SIZES[gym_id]
    prompt = messages[0]["content"][1]["text"]
    assert all(k in prompt for k in SHIPPED[gym_id].keywords)
    for keyword in SHIPPED[gym_id].keywords:
        result = env.step(f"<action>{keyword}</action>")
        assert result.metadata["valid_action"] and result.metadata["action"] == keyword
        if result.done:
            break
    env.close()
    env.close()


def test_frozenlake_walk_to_the_gift_pays_one():
    env = make_env("gym/FrozenLake-v1", {}, 0)
    env.init(None)
    # 4x4 map SFFF / FHFH / FFFH / HFFG, not slippery.
    results = [env.step(f"<action>{a}</action>") for a in ["down", "down", "right", "right", "down", "right"]]
    assert [r.reward for r in results] == [0, 0, 0, 0, 0, 1.0]
    assert results[-1].done and results[-1].observations == [] and results[-1].metadata["terminated"]


def test_cliffwalking_rewards_are_passed_through():
    env = make_env("gym/CliffWalking-v1", {}, 0)
    env.init(None)
    assert env.step("<action>up</action>").reward == -1.0
    assert env.step("<action>down</action>").reward == -1.0
    assert env.step("<action>right</action>").reward == -100.0  # off the cliff, back to start


def test_taxi_is_seed_deterministic_and_refuses_bad_keywords():
    a = make_env("gym/Taxi-v4", {}, 4).init(None)[0]
    b = make_env("gym/Taxi-v4", {}, 4).init(None)[0]
    c = make_env("gym/Taxi-v4", {}, 5).init(None)[0]
    assert a == b and a != c
    env = make_env("gym/Taxi-v4", {}, 4)
    env.init(None)
    result = env.step("<action>fly</action>")
    assert not result.metadata["valid_action"] and "pickup" in result.observations[0]["content"][1]["text"]


class _Lights(gymnasium.Env):
    """A tiny user env: light the lamp (action 1) to win; frames are 32x48 red or green."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Discrete(2)
        self.lit = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.lit = int(self.np_random.integers(0, 1))
        return self.lit, {}

    def step(self, action):
        self.lit = int(action)
        return self.lit, float(self.lit), bool(self.lit), False, {"env_feedback": "lit" if self.lit else "dark"}

    def render(self):
        frame = np.zeros((32, 48, 3), dtype=np.uint8)
        frame[..., 1 if self.lit else 0] = 255
        return frame


@pytest.fixture
def lights_registered():
    gymnasium.register(id="VlrlTestLights-v0", entry_point=_Lights)
    name = register_gym_env(GymEnvConfig("VlrlTestLights-v0", {"wait": 0, "light": 1}, "Light the lamp.", 5))
    yield name
    unregister_env(name)
    del gymnasium.registry["VlrlTestLights-v0"]


def test_user_gym_env_registered_on_the_fly(lights_registered, vlrl_check_env):
    env = make_env(lights_registered, {}, 1)
    messages, _ = env.init(None)
    assert np.asarray(load_image(messages[0]["content"][0]))[0, 0].tolist() == [255, 0, 0]
    waited = env.step("<action>wait</action>")
    assert waited.observations[0]["content"][1]["text"].startswith("Environment feedback: dark")
    lit = env.step("<action>LIGHT</action>")
    assert (lit.reward, lit.done) == (1.0, True)
    vlrl_check_env(lights_registered, n_hostile=10)


def test_unregistered_gym_id_from_row_extras(lights_registered):
    unregister_env(lights_registered)  # only gymnasium knows it now
    env = make_env("gym/VlrlTestLights-v0", {"keywords": {"on": 1, "off": 0}, "max_turns": 2}, 0)
    env.init(None)
    assert env.step("<action>on</action>").reward == 1.0
    # max_turns null in the row's extras means the default, as for a registered id (was int(None))
    assert make_env("gym/VlrlTestLights-v0", {"keywords": {"on": 1}, "max_turns": None}, 0).max_turns == 30
    with pytest.raises(EnvError, match="keywords"):
        make_env("gym/VlrlTestLights-v0", {}, 0)
    with pytest.raises(EnvError, match="outside the action space"):
        make_env("gym/VlrlTestLights-v0", {"keywords": {"boom": 7}}, 0)
