"""Invariants no other test pinned, each shown to fail when broken (see the lead's closing note):

- evaluation is reproducible end to end: two evaluations of the same checkpoint, in fresh runs, give
  identical per-episode results, and each eval row's seed is the seed its env was made with;
- an earlier image changed between turns — its pixels, hash, grid or placeholder length, each alone —
  is caught by the splice check, in both rollout modes;
- the repeats of a GRPO group are distinct samples: at T > 0 each repeat reaches the sampler with its
  own seed, and a group is never n copies of one trajectory.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from reliability_helpers import faulty_row

from vlrl.engines.types import SamplingParams
from vlrl.envs import make_env
from vlrl.render.types import PlaceholderRange
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
from vlrl.rollout.splice import PrefixError
from vlrl.train.config import load_config
from vlrl.train.run import Run

EVAL = (
    "sft.steps=0",
    "data.eval_rows=4",
    "data.train_rows=4",
    "run.samples=4",
    "run.progress=False",
    "rollout.eval_temperature=1.0",
    "rollout.max_tokens=6",
)


def evaluate_fresh(out, checkpoint) -> list[dict]:
    run = Run(load_config("color_square", [*EVAL, f"run.out={out}"]))
    try:
        run.resume(str(checkpoint))
        run.evaluate(0, "check")
    finally:
        run.close()
    return [json.loads(x) for x in (out / "samples" / "step_000000.jsonl").read_text().splitlines()]


def test_evaluation_is_reproducible_and_each_row_seed_reaches_its_env(tmp_path):
    run = Run(load_config("color_square", [*EVAL, f"run.out={tmp_path / 'a'}"]))
    try:
        checkpoint = run.save()
        rows = run.eval_rows
    finally:
        run.close()
    first, second = evaluate_fresh(tmp_path / "b", checkpoint), evaluate_fresh(tmp_path / "c", checkpoint)
    assert len(first) == 4
    for a, b in zip(first, second):
        assert (a["response_ids"], a["rewards"], a["messages"]) == (b["response_ids"], b["rewards"], b["messages"])
    assert len({json.dumps(r["messages"][0]) for r in first}) == 4  # four seeds, four different episodes
    for row, record in zip(rows, first):
        env = make_env(row.env_class, row.extras, row.seed)
        assert record["messages"][0] == env.init(row.prompt)[0][0], f"eval row seed {row.seed} did not reach its env"


def test_a_closed_run_leaves_nothing_that_holds_its_engine(tmp_path):
    """The embedded engine's worker thread holds the engine (a copy of the policy, its prefix cache, CUDA graphs):
    ``Run.close`` stops it, so a process that runs one run after another (the maze curriculum's levels) frees each."""
    import gc
    import weakref

    run = Run(load_config("color_square", [*EVAL, f"run.out={tmp_path}"]))
    run.evaluate(0, "check")  # the worker starts with the first request
    engine = weakref.ref(run.engine)
    run.close()
    del run
    gc.collect()
    assert engine() is None


class TamperingRenderer:
    """The real renderer, except that every render holding two or more images (a re-render, after the
    first observation's image) comes back with one field of the first image changed."""

    def __init__(self, renderer, field: str):
        self.inner, self.field = renderer, field
        self.tokenizer, self.merge_size = renderer.tokenizer, renderer.merge_size

    async def arender(self, messages, **kwargs):
        return self.render(messages, **kwargs)

    def render(self, messages, **kwargs):
        out = self.inner.render(messages, **kwargs)
        if out.n_images < 2 or self.field == "none":
            return out
        if self.field == "pixels":
            pixels = out.pixel_values.clone()
            pixels[0, 0] += 1.0
            return dataclasses.replace(out, pixel_values=pixels)
        if self.field == "hash":
            return dataclasses.replace(out, image_hashes=("0" * 64,) + out.image_hashes[1:])
        if self.field == "grid":
            grid = out.image_grid_thw.clone()
            grid[0, 1] += 2
            return dataclasses.replace(out, image_grid_thw=grid)
        first = out.placeholders[0]
        return dataclasses.replace(
            out, placeholders=(PlaceholderRange(first.offset, first.length - 1),) + out.placeholders[1:]
        )


@pytest.mark.parametrize("mode", ["multi_turn", "step"])
@pytest.mark.parametrize("field", ["none", "pixels", "hash", "grid", "placeholder length"])
def test_an_earlier_image_changed_between_turns_is_caught(tiny, faulty_env, mode, field):
    bundle = tiny("qwen2_vl")
    cfg = RolloutConfig(sampling=SamplingParams(max_tokens=3), mode=mode, progress=False)
    gen = RolloutGenerator(TamperingRenderer(bundle.renderer, field), bundle.engine, cfg)
    if field == "none":
        assert gen.run([faulty_row(0, turns=3)])[-1].stop_reason == "done"
        return
    with pytest.raises(PrefixError, match="turn 0: .*earlier image"):
        gen.run([faulty_row(0, turns=3)])


class SeedSpy:
    """The real engine, recording the seed every request reached it with, by prompt."""

    def __init__(self, engine):
        self.engine, self.max_context, self.seen = engine, engine.max_context, []

    async def agenerate(self, prompt, params):
        self.seen.append((prompt.image_hashes, params.seed))
        return await self.engine.agenerate(prompt, params)


def test_grpo_repeats_are_distinct_samples(tiny):
    bundle = tiny("qwen2_5_vl")
    spy = SeedSpy(bundle.engine)
    rows = [{"prompt": None, "env_class": "color_square", "extras": {}, "seed": s} for s in (0, 1)]
    cfg = RolloutConfig(sampling=SamplingParams(temperature=1.0, max_tokens=8), repeats=4, seed=11, progress=False)
    trajs = RolloutGenerator(bundle.renderer, spy, cfg).run(rows)
    first_images = {t.image_hashes[:1] for t in trajs}
    assert len(first_images) == 2  # one first observation per row, shared by its repeats
    for image in first_images:
        seeds = [seed for hashes, seed in spy.seen if hashes == image]
        assert len(seeds) == 4 and len(set(seeds)) == 4, "the repeats of a group reached the sampler with one seed"
    for group in (0, 1):
        replies = {t.response_ids for t in trajs if t.group == group}
        assert len(replies) > 1, f"group {group} is {len([t for t in trajs if t.group == group])} copies of one episode"
    again = RolloutGenerator(bundle.renderer, bundle.engine, cfg).run(rows)
    assert [t.response_ids for t in again] == [t.response_ids for t in trajs]  # seeded: reproducible
    assert all(torch.equal(a.pixel_values, b.pixel_values) for a, b in zip(again, trajs))
