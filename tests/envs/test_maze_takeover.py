"""Takeover episodes (``vlrl.envs.maze_sft_data``): the policy plays an episode's first turns, the maze expert
plays on from where that left the agent; the policy's turns stay in the history and out of the SFT loss. Built in
two phases: the policy's turns on the engine, then the whole episode as an expert episode replaying them first."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from vlrl.data.tickets import make_rows
from vlrl.envs.maze2d import DELTAS
from vlrl.envs.maze_sft_data import DetourRecorder, policy_prefixes, takeover_episodes, takeover_turns
from vlrl.envs.maze_solver import expert_actions
from vlrl.envs.maze_text import action_text, make_maze2d
from vlrl.errors import VlrlError


class _Run:
    """The ``run`` that :func:`takeover_episodes` calls: the tiny checkpoint's renderer and engine."""

    def __init__(self, bundle):
        self.bundle = bundle
        self.cfg = SimpleNamespace(rollout=SimpleNamespace(eval_temperature=0.0))
        self.max_turns: list[int | None] = []

    def rollout(self, rows, *, seed, repeats, script=None, temperature=0.0, max_turns=None):
        from vlrl.engines.types import SamplingParams
        from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

        self.max_turns.append(max_turns)
        sampling = SamplingParams(temperature=temperature, max_tokens=12, stop=("</action>",))
        config = RolloutConfig(sampling=sampling, repeats=repeats, seed=seed, max_turns=max_turns, progress=False)
        return RolloutGenerator(self.bundle.renderer, self.bundle.engine, config).run(rows, script=script)


def test_the_policys_turns_come_first_out_of_the_loss_and_the_expert_plays_the_rest(tiny):
    """Per episode the first k turns are the texts the engine played greedily (k drawn per row, at most 4), with no
    loss tokens; the expert's turns after them are in the loss and reach the goal."""
    rows = make_rows("maze2d/7x7", list(range(10)), {})
    run = _Run(tiny("qwen2_5_vl"))
    prefixes = policy_prefixes(run, rows, 0, turns=4)
    drawn = {r.seed: k for r in rows if (k := takeover_turns(r.seed, 4))}
    assert run.max_turns == [tuple(k + 1 for k in drawn.values())]  # each row's k, and the turn left to the expert
    assert {s: len(p) for s, p in prefixes.items()} == drawn  # the tiny policy ends no episode that soon
    trajs = takeover_episodes(run, rows, 0, turns=4)
    played = []
    for t in trajs:
        base, texts = len(t.prompt_ids), prefixes.get(rows[t.group].seed, ())
        spans = [slice(s.gen_start - base, s.gen_end - base) for s in t.turns]
        assert [s.text for s in t.turns[: len(texts)]] == list(texts)  # the engine's texts, replayed
        for j, g in enumerate(spans):
            assert (sum(t.loss_mask[g]) == 0) == (j < len(texts))
        assert t.total_reward == 1.0, t.turns[-1].text  # the expert finished from wherever the policy left it
        played.append(len(texts))
    assert min(played) == 0 and 0 < max(played) <= 4, played


def test_an_episode_the_policy_ends_leaves_its_last_turn_to_the_expert():
    """A policy that ends every episode on its second turn: rows drawn k >= 2 replay one turn, not two."""

    class Ends:
        cfg = SimpleNamespace(rollout=SimpleNamespace(eval_temperature=0.0))

        def rollout(self, rows, *, seed, repeats, temperature, max_turns):
            turns = (SimpleNamespace(text="<action>up</action>"), SimpleNamespace(text="<action>stop</action>"))
            return [SimpleNamespace(group=g, turns=turns) for g in range(len(rows))]

    rows = [{"seed": s} for s in range(40)]
    got = policy_prefixes(Ends(), rows, 0, turns=6)
    want = {s: min(takeover_turns(s, 6), 1) for s in range(40) if takeover_turns(s, 6)}
    assert {s: len(p) for s, p in got.items()} == want and set(want.values()) == {1}
    assert all(p == ("<action>up</action>",) for p in got.values())


def test_the_expert_plays_on_from_the_state_the_prefix_left():
    """Replaying prefix moves (the first open way in action order, worked out on a copy of the maze), the
    recorder's expert turns are the BFS path from where those moves took the agent; its flags mark the prefix."""
    prefixes = {}
    for seed in range(8):
        env = make_maze2d("easy", {}, seed)
        env.init()
        game, moves = env.gym_env.unwrapped, []
        for _ in range(seed % 4):
            r, c = game.agent
            moves.append(
                action_text(next(a for a, (dr, dc) in DELTAS.items() if game.maze_map[r + dr, c + dc] == 0), "keyword")
            )
            env.step(moves[-1])
        prefixes[seed] = tuple(moves)
    recorder = DetourRecorder(prefixes)
    for seed in range(8):
        row = {"seed": seed, "extras": {}}
        env = make_maze2d("easy", {}, seed)
        env.init()
        game = env.gym_env.unwrapped
        texts, want = [], []
        for j, text in enumerate(recorder(env, row)):
            if j == len(prefixes[seed]):  # the expert's first turn: the BFS path from here, then stop
                want = [action_text(a, "keyword") for a in expert_actions(game.maze_map, game.agent, game.target)]
            if j >= len(prefixes[seed]):
                texts.append(text)
            else:
                assert text == prefixes[seed][j]
            if env.step(text).done:
                break
        assert texts == want and want, (seed, texts, want)
        assert recorder.detours[seed] == [True] * len(prefixes[seed]) + [False] * len(texts)


def test_a_none_in_a_script_hands_that_turn_to_the_rollouts_engine(tiny):
    """A scripted episode's ``None`` turn is sampled by the engine (finite logprobs), its texts are scripted (NaN)."""
    import math

    rows = make_rows("maze2d/7x7", [0, 1], {})
    script = lambda env, row: iter([None, "<action>up</action>", None])  # noqa: E731
    trajs = _Run(tiny("qwen2_5_vl")).rollout(rows, seed=0, repeats=1, script=script, max_turns=3)
    for t in trajs:
        base = len(t.prompt_ids)
        by_engine = [not math.isnan(t.logprobs[s.gen_start - base]) for s in t.turns]
        assert by_engine == [True, False, True] and t.turns[1].text == "<action>up</action>"


def test_a_script_that_hands_a_turn_to_no_engine_is_an_error(tiny):
    from vlrl.engines.types import SamplingParams
    from vlrl.rollout.scripted import ScriptedPolicy

    renderer = tiny("qwen2_5_vl").renderer
    policy = ScriptedPolicy([None], renderer.tokenizer, max_context=4096)
    prompt = SimpleNamespace(token_ids=[1, 2, 3])
    with pytest.raises(VlrlError, match="no engine"):
        asyncio.run(policy.agenerate(prompt, SamplingParams()))  # type: ignore[arg-type]


def test_the_command_line_reads_takeover_as_two_integers():
    import argparse

    from bench_script import load  # tests/envs is on sys.path (as maze_cpu)

    mod = load("maze_curriculum.py", "maze_curriculum_cli")
    assert mod.takeover_arg("4:12") == (4, 12) and mod.takeover_arg("0:0") == (0, 0)
    for bad in ("4", "4:", "a:3", "-1:3", "4:12:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="N:M"):
            mod.takeover_arg(bad)
