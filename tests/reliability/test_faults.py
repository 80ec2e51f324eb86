"""Faults end their episode, nothing else: an env that cannot be made, whose ``init`` raises, whose
first or later observation cannot be rendered — in both rollout modes, among healthy episodes."""

from __future__ import annotations

import pytest
from reliability_helpers import faulty_row

from vlrl.engines.types import SamplingParams
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

FAULTS = {  # row extras -> (turns kept, words of the error)
    "factory raises": ({"factory_raises": True}, 0, "could not be made: RuntimeError: faulty env factory"),
    "init raises": ({"init_raises": True}, 0, "env.init raised RuntimeError: faulty env init"),
    "first observation broken": ({"first": "broken"}, 0, "first observation cannot be rendered"),
    "first observation too wide": ({"first": "aspect"}, 0, "aspect ratio"),
    "late observation too wide": ({"late": "aspect"}, 1, "turn 0: the env's observation cannot be rendered"),
    "late observation broken": ({"late": "broken"}, 1, "turn 0: the env's observation cannot be rendered"),
}


@pytest.mark.parametrize("mode", ["multi_turn", "step"])
def test_each_fault_ends_only_its_episode_as_env_error(tiny, faulty_env, mode):
    bundle = tiny("qwen2_5_vl")
    cfg = RolloutConfig(sampling=SamplingParams(max_tokens=3), mode=mode, progress=False)
    names = sorted(FAULTS)
    rows = [faulty_row(100)] + [faulty_row(k, **FAULTS[n][0]) for k, n in enumerate(names)] + [faulty_row(101)]
    trajs = RolloutGenerator(bundle.renderer, bundle.engine, cfg).run(rows)
    by_episode: dict[str, list] = {}
    for t in trajs:
        by_episode.setdefault(t.step_of or t.uid, []).append(t)
    episodes = [by_episode[f"{g}-0"] for g in range(len(rows))]
    for healthy in (episodes[0], episodes[-1]):
        assert healthy[-1].stop_reason == "done" and sum(len(t.turns) for t in healthy) == 2
    for name, episode in zip(names, episodes[1:-1]):
        _, turns, words = FAULTS[name]
        last = episode[-1]
        assert last.stop_reason == "env_error" and words in last.error, (name, last.error)
        assert sum(len(t.turns) for t in episode) == turns, name
