"""Each new check fails when the thing it guards is broken (on CPU, with real parts and one injected fault):
batch invariance when left padding leaks into attention, image sensitivity when the vision projector is
dead, and the agreement breakdown points at the first token of late turns when only those disagree."""

from __future__ import annotations

import copy

import pytest
import torch
from invariance_cases import close_stacks, prompt_of_length, stack

from vlrl.checks.agreement import breakdown, compare_logprobs
from vlrl.checks.batch_invariance import BatchVarianceError, check_batch_invariance
from vlrl.checks.image_sensitivity import ImageInsensitiveError, image_sensitivity


@pytest.fixture(scope="module", autouse=True)
def _engines_closed_after_the_module():
    yield
    close_stacks()


def test_batch_invariance_fails_when_padding_leaks_into_attention(monkeypatch):
    from vlrl.engines.embedded import EmbeddedEngine

    renderer, engine = stack("tiny", "float32", "cpu")
    prompts = [prompt_of_length(renderer, n, k, seed=i) for i, (n, k) in enumerate([(200, 1), (90, 0), (150, 2)])]
    check_batch_invariance(engine, prompts).raise_if_failed()  # healthy engine
    leaky = EmbeddedEngine(engine.model, engine.tokenizer)
    inputs = leaky._prefill_inputs
    monkeypatch.setattr(
        leaky,
        "_prefill_inputs",
        lambda reqs: {**(x := inputs(reqs)), "attention_mask": torch.ones_like(x["attention_mask"])},
    )
    with pytest.raises(BatchVarianceError, match="depend on the batch"):
        check_batch_invariance(leaky, prompts).raise_if_failed()


def test_batch_invariance_is_not_fooled_by_the_engines_prefix_cache(monkeypatch):
    """A fault in the batched prefill of every column but the last: with the alone runs' keys / values
    reused, the batched run would recompute only the last column and never reach it (how the H100 kernel
    bug went unseen); the check starts every call cold (``Engine.clear_caches``)."""
    from vlrl.engines.embedded import EmbeddedEngine

    renderer, engine = stack("tiny", "float32", "cpu")
    prompts = [prompt_of_length(renderer, n, k, seed=i) for i, (n, k) in enumerate([(120, 1), (90, 0)])]
    faulty = EmbeddedEngine(engine.model, engine.tokenizer)
    new_embeddings = faulty._new_embeddings

    def batch_dependent(requests, ids, start):
        embeds, extra = new_embeddings(requests, ids, start)
        if len(requests) > 1:
            embeds = torch.cat([embeds[:, :-1] * 1.01, embeds[:, -1:]], dim=1)
        return embeds, extra

    monkeypatch.setattr(faulty, "_new_embeddings", batch_dependent)
    with pytest.raises(BatchVarianceError, match="depend on the batch"):
        check_batch_invariance(faulty, prompts).raise_if_failed()


@pytest.fixture(scope="module")
def maze_batch(tiny):
    from vlrl.engines.types import SamplingParams
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
    from vlrl.train.batch import CollateSpec, collate

    b = tiny("qwen2_5_vl")
    cfg = RolloutConfig(sampling=SamplingParams(temperature=1.0, max_tokens=8), repeats=1, max_turns=3, progress=False)
    rows = [{"prompt": None, "env_class": "maze2d/5x5", "extras": {}, "seed": s} for s in range(3)]
    trajs = RolloutGenerator(b.renderer, b.engine, cfg).run(rows)
    return b.model, collate(trajs, CollateSpec.from_model(b.model))


def test_image_sensitivity_passes_on_a_model_that_sees(maze_batch):
    model, batch = maze_batch
    report = image_sensitivity(model, batch)
    assert len(report.turns) >= 6 and report.passed, report.summary()
    assert all(t.swap_mean_abs is not None for t in report.turns)  # same-size maze frames: always a donor


def test_image_sensitivity_fails_when_the_projector_is_dead(maze_batch):
    model, batch = maze_batch
    blind = copy.deepcopy(model)
    last = blind.model.visual.merger.mlp[-1]  # the projector's output layer: vision features become constant
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
    report = image_sensitivity(blind, batch)
    assert max(t.moved for t in report.turns) == 0.0
    with pytest.raises(ImageInsensitiveError, match="does not look at its images"):
        report.raise_if_failed()


def test_breakdown_localises_a_first_token_disagreement_at_depth():
    B, L = 2, 2600
    mask, turns = torch.zeros(B, L), torch.full((B, L), -1)
    for start, turn in ((100, 0), (700, 1), (1500, 2), (2200, 3)):  # 20 generated tokens per turn
        turns[:, start - 50 : start + 20] = turn
        mask[:, start : start + 20] = 1
    rollout = torch.zeros(B, L)
    trainer = rollout.clone()
    trainer[:, 1500] = 2.0  # only the first token of turn 2, at depth 1500
    bd = breakdown(rollout, trainer, mask, turns)
    by_depth = {label: s for label, s in bd.by_depth}
    by_pos = {label: s for label, s in bd.by_turn_position}
    assert set(by_depth) == {"0-512", "512-1k", "1k-2k", "2k-4k"}
    assert by_depth["1k-2k"].max_abs == 2.0 and by_depth["2k-4k"].max_abs == 0.0 == by_depth["0-512"].max_abs
    assert by_pos["first"].max_abs == 2.0 and by_pos["first"].n_tokens == 8 and by_pos["rest"].max_abs == 0.0
    report = compare_logprobs(rollout, trainer, mask, turn_index=turns)
    assert report.breakdown.rows()["by_turn_position"][0] == {
        "bin": "first",
        "n_tokens": 8,
        "max_abs": 2.0,
        "mean_abs": 0.5,
    }
