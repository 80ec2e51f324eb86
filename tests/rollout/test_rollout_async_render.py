"""Episodes render concurrently: a renderer behind a server (vLLM's render route) must not be waited on one
episode at a time. The rollout awaits ``Renderer.arender``; a blocking ``render`` call inside the episode's
event loop held every other episode until its answer came (on the H100, 256 renders took 15 s one after another)."""

from __future__ import annotations

import asyncio

import pytest

from vlrl.data.tickets import make_rows, train_seeds
from vlrl.engines.types import SamplingParams
from vlrl.models.build import cached_model_dir
from vlrl.render.embedded import EmbeddedRenderer
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.train.experts import expert_for


class SlowRenderer:
    """The real renderer answering after a delay, as a server would; counts renders in flight."""

    def __init__(self, inner: EmbeddedRenderer, delay: float = 0.05):
        self.inner, self.delay = inner, delay
        self.tokenizer = inner.tokenizer
        self.in_flight = self.most_in_flight = self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def render(self, messages, **kwargs):
        return self.inner.render(messages, **kwargs)

    async def arender(self, messages, **kwargs):
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return self.inner.render(messages, **kwargs)
        finally:
            self.in_flight -= 1


def test_concurrent_episodes_render_concurrently():
    path = cached_model_dir("qwen2_5_vl", "tiny")
    renderer = SlowRenderer(EmbeddedRenderer.from_pretrained(path))
    config = RolloutConfig(
        sampling=SamplingParams(max_tokens=16), max_turns=3, seed=0, progress=False, max_context=8192
    )
    gen = RolloutGenerator(renderer, None, config, tokenizer=renderer.tokenizer)
    trajectories = gen.run(make_rows("maze2d/5x5", train_seeds(4, 0), {}), script=expert_for("maze2d"))
    assert len(trajectories) == 4
    assert renderer.calls >= 8  # every first observation and every re-render went through arender
    assert renderer.most_in_flight >= 2, "episodes waited on each other's renders"


def test_a_turn_cap_per_row_ends_each_episode_at_its_own():
    """``max_turns`` as a tuple caps each row's episode at its own count (within the env's budget); an int caps
    them all. The expert would walk on: every cut episode ends ``max_turns``."""
    renderer = EmbeddedRenderer.from_pretrained(cached_model_dir("qwen2_5_vl", "tiny"))
    rows = make_rows("maze2d/easy", train_seeds(3, 0), {})
    for caps, want in (((1, 3, 2), [1, 3, 2]), (2, [2, 2, 2])):
        config = RolloutConfig(
            sampling=SamplingParams(max_tokens=16), max_turns=caps, seed=0, progress=False, max_context=8192
        )
        gen = RolloutGenerator(renderer, None, config, tokenizer=renderer.tokenizer)
        trajectories = gen.run(rows, script=expert_for("maze2d"))
        assert [len(t.turns) for t in trajectories] == want
        assert {t.stop_reason for t in trajectories} == {"max_turns"}
    config = RolloutConfig(sampling=SamplingParams(max_tokens=16), max_turns=(1, 3), progress=False, max_context=8192)
    with pytest.raises(ValueError, match="2 caps .one per row. for 3 rows"):
        RolloutGenerator(renderer, None, config, tokenizer=renderer.tokenizer).run(rows, script=expert_for("maze2d"))
