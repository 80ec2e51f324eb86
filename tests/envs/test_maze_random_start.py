"""maze2d's ``start="random"`` (extras ``start``): the agent on any floor tile, for first-turn SFT data.

The curriculum's first-turn phase (``LevelPlan.first_start``) cuts rows to one turn; from the corners every first
frame shows the agent in one of four spots, from random starts anywhere among the walls, which is what every later
turn of an episode needs read from the image. What must hold: the same seed keeps its maze and goal (only the agent
moves), the spot is a floor tile that is not the goal, the expert still reaches the goal, and first-turn rows
train the shortest path's first move from that spot.
"""

from __future__ import annotations

import numpy as np
import pytest

from vlrl.envs.contract import EnvError
from vlrl.envs.maze_solver import expert_actions
from vlrl.envs.maze_text import action_text, make_maze2d, maze2d_expert


def _game(level: str, seed: int, start: str):
    env = make_maze2d(level, {"start": start}, seed)
    env.init()
    return env, env.gym_env.unwrapped


@pytest.mark.parametrize("level", ["7x7", "easy"])
def test_random_start_keeps_the_seeds_maze_and_goal_and_moves_the_agent_onto_floor(level):
    spots = set()
    for seed in range(40):
        _, corner = _game(level, seed, "corner")
        _, rand = _game(level, seed, "random")
        assert np.array_equal(rand.maze_map, corner.maze_map) and rand.target == corner.target, seed
        assert rand.maze_map[rand.agent] == 0 and rand.agent != rand.target, (seed, rand.agent)
        assert _game(level, seed, "random")[1].agent == rand.agent  # seeded
        spots.add(rand.agent)
    corners = {(1, 1), (1, rand.width - 2), (rand.height - 2, 1), (rand.height - 2, rand.width - 2)}
    assert len(spots - corners) >= 10, spots  # anywhere, not the four corners (7x7 has 17 floor tiles)


@pytest.mark.parametrize("level", ["7x7", "easy"])
def test_expert_from_a_random_start_stops_on_the_goal(level):
    for seed in range(20):
        env, game = _game(level, seed, "random")
        result = None
        for text in maze2d_expert(env, {"seed": seed, "extras": {"start": "random"}}):
            result = env.step(text)
            if result.done:
                break
        assert result is not None and result.reward == 1.0 and game.agent == game.target, seed


def test_first_turn_rows_from_random_starts_train_the_first_move_from_there(tiny):
    """``first_turn_row(row, "random")``: one-turn episodes whose reply is the BFS first move from the random spot
    (which differs from the corner's first move for some of these seeds, so a start that is dropped fails)."""
    from test_maze_recovery_expert import _Rollouts

    from vlrl.data.tickets import make_rows
    from vlrl.envs.maze_sft_data import expert_episodes, first_turn_row

    rows = [first_turn_row(r, "random") for r in make_rows("maze2d/7x7", list(range(16)), {"expert_noise": 0.2})]
    assert all(r.extras["start"] == "random" and r.extras["max_turns"] == 1 for r in rows)
    trajs = expert_episodes(_Rollouts(tiny("qwen2_5_vl")), rows, 0, masked=False)
    differs = 0
    for t, row in zip(trajs, rows, strict=True):
        moves = {}
        for start in ("random", "corner"):
            _, game = _game("7x7", row.seed, start)
            moves[start] = action_text(expert_actions(game.maze_map, game.agent, game.target)[0], "keyword")
        assert len(t.turns) == 1 and t.turns[0].text == moves["random"], (row.seed, t.turns)
        differs += moves["random"] != moves["corner"]
    assert differs >= 3, differs


def test_first_turn_row_from_the_corners_adds_no_start():
    from vlrl.data.tickets import make_rows
    from vlrl.envs.maze_sft_data import first_turn_row

    row = make_rows("maze2d/7x7", [0], {})[0]
    assert first_turn_row(row).extras == {"max_turns": 1}


def test_start_must_be_corner_or_random():
    with pytest.raises(EnvError, match="start must be 'corner' or 'random', got 'middle'"):
        make_maze2d("7x7", {"start": "middle"}, 0)
