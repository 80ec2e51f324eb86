"""maze2d: generation statistics, the BFS expert, rendering pixels, feedback strings, text modes."""

from __future__ import annotations

import numpy as np
import pytest

from vlrl.envs import make_env
from vlrl.envs.maze2d import AGENT, FLOOR, TARGET, TILE, WALL, Maze2DEnv, render_maze
from vlrl.envs.maze_solver import expert_actions, shortest_path_actions
from vlrl.envs.maze_text import (
    FORMAT_INVALID,
    KEYWORD_INVALID,
    LEVELS,
    action_text,
    parse_keyword_action,
    parse_tuple_action,
)
from vlrl.messages import load_image

N_SEEDS = 2000


def _path_lengths(size: int) -> np.ndarray:
    env = Maze2DEnv(maze_width=size, maze_height=size)
    lengths = []
    for seed in range(N_SEEDS):
        env.reset(seed=seed)
        lengths.append(len(shortest_path_actions(env.maze_map, env.agent, env.target)))
    return np.array(lengths)


# Reference (envs.md §1, 20k mazes): easy min/median 12, P(<=14)=0.725, P(<=16)=0.94;
# hard min/median 16, P(<=16)=0.557, P(<=20)=0.85, P(<=24)=0.956. With 2,000 mazes a proportion's
# standard error is ~0.011, so +-0.04 is a ~4-sigma band: a wrong generator (DFS, Prim) misses it.
@pytest.mark.parametrize(
    "level,minimum,cdf",
    [
        ("easy", 12, {14: 0.725, 16: 0.94}),
        ("hard", 16, {16: 0.557, 20: 0.85, 24: 0.956}),
    ],
)
def test_shortest_path_distribution_matches_reference(level, minimum, cdf):
    lengths = _path_lengths(LEVELS[level]["size"])
    assert lengths.min() == minimum
    assert np.median(lengths) == minimum
    assert np.all(lengths % 2 == 0)
    for k, p in cdf.items():
        assert abs((lengths <= k).mean() - p) < 0.04, (k, (lengths <= k).mean(), p)


@pytest.mark.parametrize("level", ["easy", "hard"])
def test_mazes_are_perfect_with_corner_endpoints(level):
    size = LEVELS[level]["size"]
    env = Maze2DEnv(maze_width=size, maze_height=size)
    corners = {(1, 1), (size - 2, size - 2), (size - 2, 1), (1, size - 2)}
    for seed in range(200):
        env.reset(seed=seed)
        m = env.maze_map
        assert m[0].all() and m[-1].all() and m[:, 0].all() and m[:, -1].all()
        floor = int((m == 0).sum())
        edges = int(((m[:, :-1] == 0) & (m[:, 1:] == 0)).sum() + ((m[:-1] == 0) & (m[1:] == 0)).sum())
        assert edges == floor - 1  # a connected graph with |E| = |V| - 1 is a tree: one path between tiles
        assert env.agent in corners and env.target in corners
        assert abs(env.agent[0] - env.target[0]) == size - 3 and abs(env.agent[1] - env.target[1]) == size - 3


# Path lengths are multiples of 4 (cells sit two tiles apart and opposite corners are an even
# number of cell hops apart), so an episode needs 4k + 1 turns (moves + stop). The default budgets
# fit every expert; VisGym's 20 / 30 turns would fit path <= 16 (P = 0.94 in the reference table)
# and path <= 28 (P = 0.989).
@pytest.mark.parametrize("level,visgym_budget,within_visgym", [("easy", 20, 0.94), ("hard", 30, 0.989)])
def test_bfs_expert_solves_every_sampled_maze(level, visgym_budget, within_visgym):
    size, budget = LEVELS[level]["size"], LEVELS[level]["max_turns"]
    env = Maze2DEnv(maze_width=size, maze_height=size)
    fits = 0
    for seed in range(N_SEEDS):
        env.reset(seed=seed)
        actions = expert_actions(env.maze_map, env.agent, env.target)
        assert len(actions) % 4 == 1
        total = 0.0
        for a in actions:
            _, reward, terminated, _, info = env.step(a)
            total += reward
            assert info["env_feedback"] == "Action executed successfully."  # the expert never bumps a wall
        assert terminated and total == 1.0 and env.agent == env.target
        assert len(actions) <= budget, f"seed {seed}: expert needs {len(actions)} turns, budget {budget}"
        fits += len(actions) <= visgym_budget
    assert abs(fits / N_SEEDS - within_visgym) < 0.03


@pytest.mark.parametrize("level", ["easy", "hard"])
def test_expert_within_the_default_budget_gets_reward_one_through_text(level):
    solved = 0
    for mode in ("keyword", "tuple"):
        for seed in range(30):
            env = make_env(f"maze2d/{level}", {"action_mode": mode}, seed)
            env.init(None)
            gym = env.gym_env
            actions = expert_actions(gym.maze_map, gym.agent, gym.target)
            if len(actions) > env.max_turns:
                continue
            results = [env.step(f"I think so.\n{action_text(a, mode)}") for a in actions]
            assert [r.done for r in results] == [False] * (len(actions) - 1) + [True]
            assert [r.reward for r in results] == [0.0] * (len(actions) - 1) + [1.0]
            assert results[-1].observations == []
            solved += 1
    assert solved >= 50


def test_frame_has_agent_and_goal_at_their_tiles():
    env = Maze2DEnv(maze_width=9, maze_height=9)
    frame, _ = env.reset(seed=7)
    assert frame.shape == (225, 225, 3) and frame.dtype == np.uint8
    (ar, ac), (tr, tc) = env.agent, env.target
    agent_tile = frame[ar * TILE : (ar + 1) * TILE, ac * TILE : (ac + 1) * TILE]
    assert tuple(agent_tile[12, 12]) == AGENT  # centre: the disc
    assert tuple(agent_tile[0, 0]) == FLOOR  # corner: outside radius 6.25
    assert (agent_tile == AGENT).all(axis=2).sum() in range(110, 135)  # ~ pi * 6.25^2 = 123 px
    assert (frame[tr * TILE : (tr + 1) * TILE, tc * TILE : (tc + 1) * TILE] == TARGET).all()
    assert (frame[:TILE, :TILE] == WALL).all()
    blue = np.argwhere((frame == AGENT).all(axis=2))
    assert blue.min(0).tolist()[0] >= ar * TILE and blue.max(0).tolist()[0] < (ar + 1) * TILE
    # The frame the text env sends is this frame, losslessly.
    text_env = make_env("maze2d/easy", {}, 7)
    messages, _ = text_env.init(None)
    sent = np.asarray(load_image(messages[0]["content"][0]))
    assert np.array_equal(sent, frame)


def test_agent_on_target_and_leaving_it_leaves_no_trace():
    env = Maze2DEnv(maze_width=9, maze_height=9)
    env.reset(seed=3)
    before = render_maze(env.maze_map, env.agent, env.target)
    path = shortest_path_actions(env.maze_map, env.agent, env.target)
    for a in path:
        env.step(a)
    on_goal = env.render()
    (tr, tc) = env.target
    assert tuple(on_goal[tr * TILE + 12, tc * TILE + 12]) == AGENT
    assert tuple(on_goal[tr * TILE, tc * TILE]) == TARGET
    back = {0: 2, 2: 0, 1: 3, 3: 1}
    for a in reversed(path):
        env.step(back[a])
    assert np.array_equal(env.render(), before)  # reference quirk (white dot left on the goal) not copied


def test_reset_seed_determinism_and_reuse_renders_new_maze():
    env = Maze2DEnv(maze_width=11, maze_height=11)
    a, _ = env.reset(seed=5)
    b, _ = env.reset(seed=6)
    c, _ = env.reset(seed=5)
    assert np.array_equal(a, c) and not np.array_equal(a, b)
    assert np.array_equal(b, Maze2DEnv(11, 11).reset(seed=6)[0])  # reused env returns the new maze


def test_init_state_round_trip():
    env = Maze2DEnv(maze_width=9, maze_height=9)
    frame, _ = env.reset(seed=11)
    state = env.get_init_state()
    other = Maze2DEnv(maze_width=9, maze_height=9)
    restored, _ = other.reset(seed=999, options={"init_state": state})
    assert np.array_equal(frame, restored)


def test_reward_only_on_stop_at_goal():
    env = Maze2DEnv(maze_width=9, maze_height=9)
    env.reset(seed=2)
    _, reward, terminated, _, _ = env.step(4)  # stop at the start
    assert (reward, terminated) == (0.0, True)
    env.reset(seed=2)
    for a in shortest_path_actions(env.maze_map, env.agent, env.target):
        _, reward, terminated, truncated, info = env.step(a)
        assert reward == 0.0 and not terminated and not truncated  # reaching the goal does not end it
    assert info["distance"] == 0
    assert env.step(4)[1:3] == (1.0, True)


def test_even_sizes_refused():
    with pytest.raises(ValueError):
        Maze2DEnv(maze_width=10, maze_height=9)


def test_gymnasium_env_checker_passes():
    import gymnasium
    from gymnasium.utils.env_checker import check_env

    from vlrl.envs.builtin import register_with_gymnasium

    register_with_gymnasium()
    env = gymnasium.make("vlrl/Maze2D-v0", maze_width=9, maze_height=9)
    check_env(env.unwrapped, skip_render_check=False)  # also tries the "ansi" render mode via the spec
    assert env.reset(seed=0)[0].shape == (225, 225, 3)


# ------------------------------------------------------------------ text: every feedback string of the spec


def _feedback(env, text):
    return env.step(text).metadata["feedback"]


def test_every_feedback_string_is_produced():
    env = make_env("maze2d/easy", {"action_mode": "tuple"}, 0)
    env.init(None)
    start = env.gym_env.agent
    blocked = next(
        a
        for a, (dr, dc) in {0: (0, 1), 1: (-1, 0), 2: (0, -1), 3: (1, 0)}.items()
        if env.gym_env.maze_map[start[0] + dr, start[1] + dc] == 1
    )
    assert _feedback(env, f"('move', {blocked})") == "Cannot move into a wall."
    open_move = expert_actions(env.gym_env.maze_map, start, env.gym_env.target)[0]
    assert _feedback(env, f"('move', {open_move})") == "Action executed successfully."
    fb = _feedback(env, "move right please")
    assert fb.startswith("Cannot parse action string 'move right please': ") and fb.endswith(
        " so the action is invalid."
    )
    assert _feedback(env, "('move', 0, 1)") == FORMAT_INVALID
    assert FORMAT_INVALID == (
        "The action format is invalid. The action should be a tuple of two elements with the "
        "first element being the action name and the second element being the action payload."
    )
    assert (
        _feedback(env, "('move', 7)") == "The action 7 is not in the valid action space of move so nothing is executed."
    )
    assert _feedback(env, "('stop', 'done')") == (
        "The action done is not in the valid action space of stop so nothing is executed."
    )
    assert _feedback(env, "('jump', 1)") == "The action name 'jump' is not recognized in the available action space."
    kw = make_env("maze2d/easy", {}, 0)
    kw.init(None)
    assert _feedback(kw, "<action>jump</action>") == KEYWORD_INVALID
    assert KEYWORD_INVALID == (
        "Action parsing failed. Could not find a valid action in your response.\nPlease end "
        "your response with <action>ACTION</action> where ACTION is one of: down, left, "
        "right, stop, up"
    )
    result = kw.step("<action>stop</action>")
    assert result.done and result.metadata["feedback"] == "Action executed successfully."


@pytest.mark.parametrize(
    "text,expected",
    [
        ("('move', 0)", 0),
        ("I go up: ('move', 1)", 1),
        ("```python\n('move', 2)\n```", 2),
        ('("move", 3)', 3),
        ("('move', 0) then ('stop', 'stop')", 4),
        ("('move', '0')", None),
        ("('move', True)", None),
        ("('move', 0.0)", None),
        ("__import__('os').system('true')", None),
        ("", None),
        ("(" * 10_000, None),
    ],
)
def test_tuple_parser(text, expected):
    assert parse_tuple_action(text).action == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("<action>left</action>", 2),
        ("<ACTION> Right </ACTION>", 0),
        ("<action>up</action> no, <action>down</action>", 3),
        ("<action>stop</action>", 4),
        ("left", None),
        ("<action>leftt</action>", None),
        ("<action>left", None),
        ("<action>__import__</action>", None),
    ],
)
def test_keyword_parser(text, expected):
    assert parse_keyword_action(text).action == expected


def test_step_counter_prompt():
    assert make_env("maze2d/easy", {}, 1).init(None)[1]["max_turns"] == LEVELS["easy"]["max_turns"] == 30
    env = make_env("maze2d/easy", {"action_mode": "tuple", "max_turns": 20}, 1)  # VisGym's budget
    messages, info = env.init(None)
    assert info["max_turns"] == 20
    content = messages[0]["content"]
    assert [p["type"] for p in content] == ["image_url", "text"]
    text = content[1]["text"]
    assert text.startswith("You are navigating a 9x9 maze. The maze consists of walls (gray) and paths (white).")
    assert "Format: `('move', direction)`" in text
    assert text.endswith("\nThis is step 1. You are allowed to take 19 more steps.")
    obs = env.step("('move', 9)").observations[0]["content"][1]["text"]
    assert obs == (
        "Environment feedback: The action 9 is not in the valid action space of move so nothing is "
        "executed.\n\nThis is step 2. You are allowed to take 18 more steps."
    )
    hard = make_env("maze2d/hard", {"max_turns": 30}, 1)
    text = hard.init(None)[0][0]["content"][1]["text"]
    assert text.startswith("You are navigating a 11x11 maze.") and "<action>ACTION</action>" in text
    assert "('move'" not in text  # the keyword prompt does not contradict its own format
    assert text.endswith("This is step 1. You are allowed to take 29 more steps.")


def test_turn_budget_ends_the_episode():
    env = make_env("maze2d/easy", {"max_turns": 3}, 0)
    env.init(None)
    results = [env.step("<action>up</action>") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].observations == [] and results[-1].reward == 0.0
