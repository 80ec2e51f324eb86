"""The maze2d expert's recovery demonstrations (extras ``expert_noise``): detours, then the way back."""

from __future__ import annotations

import pytest

from vlrl.envs.contract import EnvError
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


class _Rollouts:
    """The ``run.rollout`` that :func:`expert_episodes` calls, on the tiny checkpoint's renderer."""

    def __init__(self, bundle):
        from vlrl.engines.types import SamplingParams
        from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

        sampling = SamplingParams(max_tokens=12, stop=("</action>",))
        self.gen = RolloutGenerator(bundle.renderer, bundle.engine, RolloutConfig(sampling=sampling, progress=False))

    def rollout(self, rows, *, seed, repeats, script):
        return self.gen.run(rows, script=script)


def test_masked_detours_stay_in_the_history_and_leave_the_loss(tiny):
    """Same rows, same tokens; the masked episodes' loss covers exactly the unmasked loss minus the
    generated tokens of the detour turns (the way back and ``stop`` stay trained)."""
    from vlrl.data.tickets import make_rows
    from vlrl.envs.maze_sft_data import DetourRecorder, expert_episodes

    rows = make_rows("maze2d/5x5", list(range(12)), {"expert_noise": 0.4})
    run = _Rollouts(tiny("qwen2_5_vl"))
    plain, masked = expert_episodes(run, rows, 0, masked=False), expert_episodes(run, rows, 0, masked=True)
    recorder = DetourRecorder()
    run.rollout(rows, seed=0, repeats=1, script=recorder)
    n_detours = 0
    for p, m, row in zip(plain, masked, rows, strict=True):
        assert p.token_ids == m.token_ids
        flags = recorder.detours[row.seed]
        assert len(flags) == len(p.turns) and not flags[-1]  # stop is never a detour
        base = len(p.prompt_ids)
        for span, detour in zip(p.turns, flags, strict=True):
            gen = slice(span.gen_start - base, span.gen_end - base)
            assert sum(p.loss_mask[gen]) > 0
            assert sum(m.loss_mask[gen]) == (0 if detour else sum(p.loss_mask[gen]))
            n_detours += detour
        assert sum(m.loss_mask) < sum(p.loss_mask) or not any(flags)
    assert n_detours >= 3, n_detours


def test_first_turn_rows_train_on_the_bfs_first_move_alone(tiny):
    """The curriculum's first-turn SFT (``first_turn_row``): noisy rows cut to one turn give one-turn episodes
    whose reply is the shortest path's first move (no room for a detour in a one-turn budget)."""
    from vlrl.data.tickets import make_rows
    from vlrl.envs.maze_sft_data import expert_episodes, first_turn_row

    rows = [first_turn_row(r) for r in make_rows("maze2d/5x5", list(range(12)), {"expert_noise": 0.9})]
    trajs = expert_episodes(_Rollouts(tiny("qwen2_5_vl")), rows, 0, masked=False)
    for t, row in zip(trajs, rows, strict=True):
        env = make_maze2d("5x5", {}, row.seed)
        env.init()
        game = env.gym_env.unwrapped
        first = action_text(expert_actions(game.maze_map, game.agent, game.target)[0], "keyword")
        assert len(t.turns) == 1 and t.turns[0].text == first, (row.seed, t.turns)
        assert sum(t.loss_mask) > 0


def test_expert_open_names_the_moves_no_wall_blocks_and_plays_the_same_episode():
    """``expert_open``: each reply first names the open directions, then the same action as without it; the
    env parses the action alone (same feedback, same reward); every move the expert plays that the env then
    reports as a wall bump was left out of that turn's open list, and every other one was in it."""
    checked_bumps = 0
    for level, seed in (("7x7", 1), ("easy", 2), ("hard", 3), ("5x5", 4)):
        extras = {"expert_noise": 0.3, "expert_open": True}
        row = {"seed": seed, "extras": extras}
        env = make_maze2d(level, extras, seed)
        env.init()
        texts = []
        for text in maze2d_expert(env, row):
            head, action = text.split("\n")
            result = env.step(text)
            texts.append(action)
            word = action.removeprefix("<action>").removesuffix("</action>")
            if word != "stop":
                bumped = result.metadata["feedback"] == FEEDBACK_WALL
                checked_bumps += bumped
                assert head.startswith("open: ") and (word in head.split()[1:]) != bumped, (level, head, word)
            if result.done:
                break
        assert result.reward == 1.0
        assert texts == _play(level, seed, 0.3)[0]  # the actions of the episode without the prefix
    assert checked_bumps >= 2


def test_expert_open_must_be_a_bool():
    env = make_maze2d("5x5", {}, 0)
    env.init()
    with pytest.raises(EnvError, match="expert_open must be true or false, got 'yes'"):
        next(maze2d_expert(env, {"seed": 0, "extras": {"expert_open": "yes"}}))


def test_branch_detours_walk_down_wrong_branches_into_dead_ends_and_still_stop_on_the_goal():
    """``expert_branch``: the detours run several moves down a branch the shortest path does not take, some end
    pressing into a dead end's wall more than once (the policy's own failure, item 18 of docs/maze.md), and every
    episode still ends with stop on the goal inside the budget, the detours flagged for the loss mask."""
    from vlrl.envs.maze_text import expert_turns

    runs = bumps_in_a_row = 0
    for level in ("7x7", "easy", "hard"):
        for seed in range(30):
            extras = {"expert_branch": 0.3}
            env = make_maze2d(level, extras, seed)
            env.init()
            flags, feedback, result = [], [], None
            for text, detour in expert_turns(env, {"seed": seed, "extras": extras}):
                result = env.step(text)
                flags.append(detour)
                feedback.append(result.metadata["feedback"])
                if result.done:
                    break
            assert result.reward == 1.0 and len(flags) <= LEVELS[level]["max_turns"] and not flags[-1], (level, seed)
            run = 0  # detour moves in a row that went somewhere: a walk down the branch
            for detour, said in zip(flags, feedback, strict=True):
                run = run + 1 if detour and said != FEEDBACK_WALL else 0
                runs += run == 5
            bumps_in_a_row += any(
                flags[i] and flags[i + 1] and feedback[i] == feedback[i + 1] == FEEDBACK_WALL
                for i in range(len(flags) - 1)
            )
    assert runs >= 10 and bumps_in_a_row >= 10, (runs, bumps_in_a_row)


def test_branch_detours_are_seeded_and_leave_the_noise_episodes_as_they_were():
    def play(extras, seed):
        env = make_maze2d("easy", extras, seed)
        env.init()
        texts = []
        for text in maze2d_expert(env, {"seed": seed, "extras": extras}):
            texts.append(text)
            if env.step(text).done:
                return texts
        raise AssertionError("the expert stopped without stop")

    both = {"expert_noise": 0.2, "expert_branch": 0.2}
    assert play(both, 5) == play(both, 5)
    assert any(play(both, s) != play({"expert_noise": 0.2}, s) for s in range(5))
    for seed in range(10):
        assert play({"expert_noise": 0.2, "expert_branch": 0.0}, seed) == _play("easy", seed, 0.2)[0]
