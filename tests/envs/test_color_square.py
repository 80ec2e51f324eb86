"""color_square: answers, reward definition (fraction correct), frames, gymnasium checker."""

from __future__ import annotations

import numpy as np
import pytest

from vlrl.envs import EnvError, make_env
from vlrl.envs.color_square import BACKGROUND, DEFAULT_PALETTE, colour_parser
from vlrl.messages import load_image

NAMES = list(DEFAULT_PALETTE)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<answer>red</answer>", "red"),
        ("<ANSWER> Blue </answer>", "blue"),
        ("green", "green"),
        ("  Yellow.\n", "yellow"),
        ("<answer>red</answer> wait <answer>green</answer>", "green"),
        ("red or blue", None),
        ("purple", None),
        ("<answer>purple</answer>", None),
        ("", None),
        ("the answer is red", None),
        ("r" * 100_000, None),
        ("<answer>re d</answer>", None),
    ],
)
def test_parser_lenient_on_form_strict_on_content(text, expected):
    parsed = colour_parser(NAMES)(text)
    assert parsed.name == expected
    assert (parsed.action is None) == (expected is None)
    if expected is None:
        assert "one of: red, green, blue, yellow" in parsed.feedback


def _true_colour(messages) -> str:
    """Read the square's colour off the image the policy sees."""
    pixels = np.asarray(load_image(messages[0]["content"][0])).reshape(-1, 3)
    square = pixels[(pixels != BACKGROUND).any(axis=1)]
    rgb = tuple(int(v) for v in square[0])
    return next(name for name, colour in DEFAULT_PALETTE.items() if colour == rgb)


def test_single_turn_reward_is_one_for_the_right_colour_only():
    for seed in range(12):
        env = make_env("color_square", {}, seed)
        messages, _ = env.init(None)
        colour = _true_colour(messages)
        result = env.step(f"<answer>{colour}</answer>")
        assert (result.reward, result.done, result.observations) == (1.0, True, [])
        env = make_env("color_square", {}, seed)
        env.init(None)
        wrong = next(n for n in NAMES if n != colour)
        assert env.step(wrong).reward == 0.0


def test_multi_turn_return_is_fraction_correct():
    env = make_env("color_square", {"n_turns": 4, "image_size": 96, "square_sizes": [20, 60]}, 3)
    messages, _ = env.init(None)
    assert env.max_turns == 4
    rewards, answers_right = [], [True, False, True, True]
    for right in answers_right:
        colour = _true_colour(messages)
        answer = colour if right else next(n for n in NAMES if n != colour)
        result = env.step(f"<answer>{answer}</answer>")
        rewards.append(result.reward)
        messages = result.observations
        if not result.done:
            assert load_image(messages[0]["content"][0]).size == (96, 96)
            fb = messages[0]["content"][1]["text"]
            assert fb == "Environment feedback: Correct." if right else fb.startswith("Environment feedback: Wrong")
    assert result.done and sum(rewards) == pytest.approx(0.75)


def test_unparseable_answer_costs_the_turn():
    env = make_env("color_square", {}, 0)
    env.init(None)
    result = env.step("I am not sure")
    assert result.done and result.reward == 0.0 and not result.metadata["valid_action"]


def test_prompt_and_image_size():
    messages, _ = make_env("color_square", {}, 0).init(None)
    assert [p["type"] for p in messages[0]["content"]] == ["image_url", "text"]
    assert load_image(messages[0]["content"][0]).size == (56, 56)
    assert "<answer>COLOUR</answer>" in messages[0]["content"][1]["text"]


def test_custom_palette_and_bad_extras():
    env = make_env("color_square", {"palette": {"black": [0, 0, 0], "white2": [250, 250, 250]}}, 1)
    env.init(None)
    assert env.example_actions == ["<answer>black</answer>", "<answer>white2</answer>"]
    with pytest.raises(EnvError):
        make_env("color_square", {"square_sizes": [80, 90], "image_size": 56}, 0)


def test_gymnasium_env_checker_passes():
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    from vlrl.envs.builtin import register_with_gymnasium

    register_with_gymnasium()
    env = gymnasium.make("vlrl/ColorSquare-v0", n_turns=2, image_size=64)
    check_env(env.unwrapped, skip_render_check=False)
    assert env.reset(seed=0)[0].shape == (64, 64, 3)
