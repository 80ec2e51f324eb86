"""Fixtures of the trainer tests: rollouts of the tiny models, cached for the session."""

from __future__ import annotations

import functools

import pytest
import traj_helpers as H


@pytest.fixture(scope="session")
def single_turn(tiny):
    """``single_turn(arch, T)`` -> (bundle, trajectories, generations): text, single-image,
    three-image and two same-size-image prompts generated as one engine batch, engine top-5 on."""

    @functools.cache
    def get(arch: str, temperature: float):
        b = tiny(arch)
        convs = list(H.conversations().values()) + H.same_shape_pair()
        trajs, gens = H.rollout(b, convs, temperature, topk=5, max_tokens=20)
        return b, trajs, gens

    return get


@pytest.fixture(scope="session")
def multi_turn(tiny):
    """``multi_turn(arch)`` -> (bundle, trajectories): 3-turn maze2d episodes from the rollout generator (T=0.7)."""

    @functools.cache
    def get(arch: str):
        from vlrl.engines.types import SamplingParams
        from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

        b = tiny(arch)
        cfg = RolloutConfig(
            sampling=SamplingParams(temperature=0.7, max_tokens=12), repeats=2, max_turns=3, progress=False
        )
        rows = [{"prompt": None, "env_class": "maze2d/easy", "extras": {}, "seed": s} for s in range(2)]
        return b, RolloutGenerator(b.renderer, b.engine, cfg).run(rows)

    return get
