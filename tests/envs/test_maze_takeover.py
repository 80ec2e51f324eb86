"""Takeover episodes (``vlrl.envs.maze_sft_data``): the policy plays an episode's first turns, the maze expert
plays on from where that left the agent; the policy's turns stay in the history and out of the SFT loss."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from vlrl.data.tickets import make_rows
from vlrl.envs.maze2d import DELTAS
from vlrl.envs.maze_sft_data import TakeoverRecorder, takeover_episodes
from vlrl.envs.maze_solver import expert_actions
from vlrl.envs.maze_text import action_text, make_maze2d
from vlrl.errors import VlrlError


class _Run:
    """The ``run`` that :func:`takeover_episodes` calls: the tiny checkpoint's renderer and engine."""

    def __init__(self, bundle):
        self.bundle = bundle
        self.cfg = SimpleNamespace(rollout=SimpleNamespace(eval_temperature=0.0))

    def rollout(self, rows, *, seed, repeats, script, temperature):
        from vlrl.engines.types import SamplingParams
        from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

        sampling = SamplingParams(temperature=temperature, max_tokens=12, stop=("</action>",))
        config = RolloutConfig(sampling=sampling, repeats=repeats, seed=seed, progress=False)
        return RolloutGenerator(self.bundle.renderer, self.bundle.engine, config).run(rows, script=script)


def test_the_engine_plays_the_first_turns_out_of_the_loss_and_the_expert_the_rest(tiny):
    """Per episode, the turns with the engine's (finite) logprobs come first, up to 4 of them, and have no loss
    tokens; the scripted turns after them (NaN logprobs) are the expert's, in the loss, and reach the goal."""
    rows = make_rows("maze2d/7x7", list(range(10)), {})
    trajs = takeover_episodes(_Run(tiny("qwen2_5_vl")), rows, 0, turns=4)
    played = []
    for t in trajs:
        base = len(t.prompt_ids)
        spans = [slice(s.gen_start - base, s.gen_end - base) for s in t.turns]
        engine = [not any(math.isnan(x) for x in t.logprobs[g]) for g in spans]
        n = engine.count(True)
        assert engine == [True] * n + [False] * (len(engine) - n), engine  # the policy's turns come first
        for g, by_engine in zip(spans, engine, strict=True):
            assert (sum(t.loss_mask[g]) == 0) == by_engine
        assert t.total_reward == 1.0, t.turns[-1].text  # the expert finished from wherever the policy left it
        played.append(n)
    assert min(played) == 0 and 0 < max(played) <= 4, played  # k drawn per row from 0 to 4


def test_the_expert_plays_on_from_the_state_the_policy_left():
    """Driven by hand (a real move at each ``None``), the recorder's expert turns are the BFS path from where those
    moves took the agent, and its flags mark the policy's turns."""
    recorder = TakeoverRecorder(turns=6)
    for seed in range(8):
        row = {"seed": seed, "extras": {}}
        env = make_maze2d("easy", {}, seed)
        env.init()
        game = env.gym_env.unwrapped
        script, texts, policy_turns = recorder(env, row), [], 0
        for text in script:
            if text is None:  # the policy's turn: a move onto floor, the first open way in action order
                r, c = game.agent
                move = next(a for a, (dr, dc) in DELTAS.items() if game.maze_map[r + dr, c + dc] == 0)
                env.step(action_text(move, "keyword"))
                policy_turns += 1
                continue
            if not texts:  # the expert's first turn: the BFS path from here, then stop
                want = [action_text(a, "keyword") for a in expert_actions(game.maze_map, game.agent, game.target)]
            texts.append(text)
            if env.step(text).done:
                break
        assert texts == want[: len(texts)] and len(texts) == len(want), (seed, texts, want)
        assert recorder.detours[seed] == [True] * policy_turns + [False] * len(texts)
    assert any(recorder.detours[s][0] for s in range(8)) and not all(recorder.detours[s][0] for s in range(8))


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
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "maze_curriculum.py"
    spec = importlib.util.spec_from_file_location("maze_curriculum_cli", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.takeover_arg("4:12") == (4, 12) and mod.takeover_arg("0:0") == (0, 0)
    for bad in ("4", "4:", "a:3", "-1:3", "4:12:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="N:M"):
            mod.takeover_arg(bad)
