"""The maze2d expert's recovery demonstrations (extras ``expert_noise``): detours, then the way back."""

from __future__ import annotations

import pytest

from vlrl.envs.maze2d import FEEDBACK_WALL
from vlrl.envs.maze_solver import expert_actions
from vlrl.envs.maze_text import LEVELS, action_text, make_maze2d, maze2d_expert


def _play(level: str, seed: int, noise: float) -> tuple[list[str], list[str], float]:
    """(texts played, feedback after each, reward) of one expert episode."""
    row = {"seed": seed, "extras": {"expert_noise": noise}}
    env = make_maze2d(level, row["extras"], seed)
    env.init()
    texts, feedback, result = [], [], None
    for text in maze2d_expert(env, row):
        result = env.step(text)
        texts.append(text)
        feedback.append(str(result.metadata["feedback"]))
        if result.done:
            break
    return texts, feedback, result.reward


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_noisy_expert_detours_and_still_stops_on_the_goal_within_the_budget(level):
    """With a detour on a third of the turns, every episode still ends with stop on the goal inside the
    level's turn budget (detours are taken only while the way back fits), and the detours include wall
    bumps (the feedback the policy must learn to recover from) and steps off the shortest path."""
    bumps = extra = 0
    for seed in range(60):
        texts, feedback, reward = _play(level, seed, 0.3)
        assert reward == 1.0 and len(texts) <= LEVELS[level]["max_turns"], (seed, texts)
        bumped = sum(f == FEEDBACK_WALL for f in feedback)
        bumps += bumped
        env = make_maze2d(level, {}, seed)
        env.init()
        game = env.gym_env.unwrapped
        extra += len(texts) - len(expert_actions(game.maze_map, game.agent, game.target)) - bumped
    assert bumps >= 20 and extra > 0, (bumps, extra)


def test_noisy_expert_is_seeded_and_noise_zero_is_the_bfs_expert():
    assert _play("7x7", 3, 0.3) == _play("7x7", 3, 0.3)
    assert any(_play("7x7", s, 0.3)[0] != _play("7x7", s + 100, 0.3)[0] for s in range(5))
    for seed in range(20):
        env = make_maze2d("easy", {}, seed)
        env.init()
        game = env.gym_env.unwrapped
        want = [action_text(a, "keyword") for a in expert_actions(game.maze_map, game.agent, game.target)]
        assert _play("easy", seed, 0.0)[0] == want
