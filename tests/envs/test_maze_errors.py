"""benchmarks/maze_errors.py's turn labels: the replay that says where a maze policy's episodes went wrong."""

from __future__ import annotations

from bench_script import load  # tests/envs is on sys.path (as maze_cpu)

from vlrl.envs.maze2d import DELTAS
from vlrl.envs.maze_solver import expert_actions
from vlrl.envs.maze_text import action_text, make_maze2d


def _module():
    return load("maze_errors.py")


def _expert(seed: int) -> tuple[list[int], object]:
    env = make_maze2d("easy", {}, seed)
    env.init()
    game = env.gym_env.unwrapped
    return expert_actions(game.maze_map, game.agent, game.target), game


def test_the_experts_episode_is_all_ok_and_each_kind_of_mistake_is_named():
    errors = _module()
    words = lambda actions: [action_text(a, "keyword") for a in actions]  # noqa: E731
    for seed in range(5):
        actions, game = _expert(seed)
        letters, labels, choices = errors.label_turns(make_maze2d("easy", {}, seed), words(actions))
        assert labels == ["ok"] * len(actions) and letters == "".join("RULDS"[a] for a in actions)
        assert len(choices) == len(actions) and choices[-1] is None  # stop on the goal is no choice
        first = actions[0]
        row, col = game.agent
        walls = [a for a, (dr, dc) in DELTAS.items() if game.maze_map[row + dr, col + dc] == 1]
        opens = [a for a, (dr, dc) in DELTAS.items() if game.maze_map[row + dr, col + dc] == 0 and a != first]
        replies = words([walls[0], *([opens[0]] if opens else []), 4]) + ["no action here"]
        _, labels, _ = errors.label_turns(make_maze2d("easy", {}, seed), replies)
        assert labels == ["wall", *(["off_path"] if opens else []), "stop_off_goal"], (seed, labels)
    summary = errors.summarise(
        [
            {"solved": True, "moves": "RS", "labels": ["ok", "ok"]},
            {"solved": True, "moves": "LRRS", "labels": ["off_path", "ok", "ok", "ok"]},
            {"solved": False, "moves": "RLLL", "labels": ["ok", "off_path", "wall", "wall"], "stop": "length"},
        ],
        budget=3,
    )
    assert summary["stop_reasons"] == {"unrecorded": 2, "length": 1}  # a context-ended episode is told apart
    assert summary["solved"] == 2 and summary["with_a_mistake"] == 2 and summary["solved_after_a_mistake"] == 1
    assert summary["first_mistake"] == {"off_path": 2} and summary["first_mistake_turn"] == {0: 1, 1: 1}
    assert summary["ok_share"] == 0.6 and summary["failed_moves"] == ["RLLL"]
    # the 4-turn solve is past a 3-turn budget: a success under vlrl's budget, not under VisGym's
    assert summary["solved_turns"] == {2: 1, 4: 1} and summary["solved_within_budget"] == 1
    assert "fit_budget" not in summary  # these episodes carry no fewest_turns


def test_mazes_whose_path_and_stop_do_not_fit_the_budget_are_counted_apart():
    """lease_v4's easy: 173 of 200 solved under 20 turns, 10 of the failures on the goal with no turn left for
    ``stop``; the aim's arithmetic needs the mazes that can be solved in time, counted by the tool."""
    errors = _module()

    def ep(solved: bool, turns: int, fewest: int) -> dict:
        return {"solved": solved, "moves": "R" * turns, "labels": ["ok"] * turns, "fewest_turns": fewest}

    episodes = [ep(True, 13, 13), ep(True, 17, 17), ep(False, 20, 17), ep(False, 20, 21), ep(True, 21, 21)]
    summary = errors.summarise(episodes, budget=20)
    # 20 moves and a stop take 21 turns: two mazes cannot be solved within 20, whatever the policy
    assert summary["fit_budget"] == 3 and summary["solved_of_fitting"] == 2
    assert summary["solved_within_budget"] == 2
    assert errors.summarise(episodes, budget=21)["fit_budget"] == 5  # 21 turns hold them all
    facts = errors.replay_facts(make_maze2d("easy", {}, 0), "", [])  # no move played: the whole path is left
    assert facts["fewest_turns"] == facts["left"] + 1 == len(_expert(0)[0])


def test_a_budget_set_on_the_rows_reaches_the_env_and_its_step_counter():
    from vlrl.data.tickets import eval_seeds, make_rows

    errors = _module()
    rows = make_rows("maze2d/easy", eval_seeds(2), {"expert_noise": 0.1})
    assert errors.with_budget(rows, None) == list(rows)
    capped = errors.with_budget(rows, 20)
    assert [r.extras for r in capped] == [{"expert_noise": 0.1, "max_turns": 20}] * 2
    env = make_maze2d("easy", capped[0].extras, capped[0].seed)
    messages, info = env.init()
    assert env.max_turns == info["max_turns"] == 20
    assert "allowed to take 19 more steps" in str(messages)  # the counter names the budget the policy plays under


def test_choices_are_counted_on_the_way_to_the_first_mistake_and_the_expert_makes_none():
    errors = _module()
    counts = errors.choice_counts(
        [
            {"labels": ["ok", "off_path", "ok"], "choices": ["tie", "tie", "toward"]},
            {"labels": ["wall", "ok"], "choices": [None, "away"]},
            {"labels": ["ok", "ok"], "choices": ["away", None]},
            {"labels": ["off_path"]},
        ]
    )
    # turns after the first mistake are not counted: the agent is off the shortest path there
    assert counts["choices_on_the_path"] == {"toward": [0, 0], "tie": [2, 1], "away": [1, 0]}
    assert counts["first_mistake_at"] == {"tie": 1, "corridor": 2}
    # the replay names the expert's forks as path_choices does (the SFT farm's pick of mazes reads those)
    from vlrl.envs.maze_solver import path_choices

    kinds = set()
    for seed in range(20):
        actions, game = _expert(seed)
        _, _, choices = errors.label_turns(make_maze2d("easy", {}, seed), [action_text(a, "keyword") for a in actions])
        assert choices == [*path_choices(game.maze_map, game.agent, game.target), None], seed
        kinds |= set(choices)
    assert kinds == {None, "toward", "tie", "away"}


def test_a_return_down_the_wrong_way_taken_last_time_is_told_from_one_that_takes_another():
    import numpy as np

    errors = _module()
    maze = np.ones((3, 6), dtype=np.int64)
    maze[1, 1:5] = 0  # one corridor, (1, 1) to (1, 4)
    # left off the path and back, left again (the same wrong way), back, then right on (the path)
    labels = ["off_path", "ok", "off_path", "ok", "ok"]
    assert errors.returns(maze, (1, 2), "LRLRR", labels) == ["same", "path"]
    # back from the left (a wrong way), up into the wall, then left once more (after a bump: no return)
    assert errors.returns(maze, (1, 2), "LRUL", ["off_path", "ok", "wall", "off_path"]) == ["other"]
    # a wall bump leaves the agent where it was: no way out, so the next turn is no return
    assert errors.returns(maze, (1, 2), "LLR", ["off_path", "wall", "ok"]) == []
    # back where the last move was right (a later mistake brought it back): taking it again is no repeat
    assert errors.returns(maze, (1, 2), "RLR", ["ok", "off_path", "ok"]) == []
    episodes = [{"returns": ["same", "path"]}, {"returns": ["same"]}, {}]
    assert errors.return_counts(episodes) == {"same": 2, "path": 1}
    for seed in range(5):  # the expert takes no wrong way, so it never comes back from one
        actions, game = _expert(seed)
        letters, labels, _ = errors.label_turns(
            make_maze2d("easy", {}, seed), [action_text(a, "keyword") for a in actions]
        )
        assert errors.returns(game.maze_map, game.agent, letters, labels) == []
        # where an episode ends: on the goal, or as many moves short of it as were not played
        assert errors.replay_facts(make_maze2d("easy", {}, seed), letters, labels) == {
            "returns": [],
            "left": 0,
            "fewest_turns": len(actions),  # the expert's moves and its stop
        }
        cut = letters[:3]
        facts = errors.replay_facts(make_maze2d("easy", {}, seed), cut, labels[:3])
        assert facts["left"] == len(actions) - 1 - 3
