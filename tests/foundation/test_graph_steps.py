"""The embedded engine's static decode steps (``vlrl.engines.graphs``): CUDA graph replays on a GPU, the same
step eagerly elsewhere. A request's tokens and logprobs are those of the eager path (``DynamicSteps``) whatever
slot its batch decodes in, as rows leave and the batch moves to smaller slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlrl.engines.embedded import EmbeddedEngine
from vlrl.engines.graphs import COLUMNS, bucket
from vlrl.engines.types import SamplingParams

from .test_engine import prompts

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LENGTHS = (3, 20, 7, 12, 16)
"""New tokens per row of a 5-row batch: rows leave at 3, 7, 12 and 16 steps -> slots of 8, 4, 2 and 1 rows."""


def batch(renderer):
    ps = prompts(renderer)
    order = [ps["single"], ps["multi"], ps["single"], ps["multi"], ps["single"]]
    params = [
        SamplingParams(temperature=0.0 if k == 2 else 1.0, max_tokens=n, seed=k, ignore_eos=True, logprobs_topk=3)
        for k, n in enumerate(LENGTHS)
    ]
    return order, params


def generate(engine, renderer):
    order, params = batch(renderer)
    return engine.generate(order, params)


def assert_same(got, want, atol):
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.token_ids == w.token_ids, f"row {k}: tokens differ"
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=atol, err_msg=f"row {k}")
        for gt, wt in zip(g.top_logprobs, w.top_logprobs, strict=True):
            assert [i for i, _ in gt] == [i for i, _ in wt]


def test_slot_shapes():
    assert [bucket(n) for n in (1, 2, 3, 5, 64, 65, 256)] == [1, 2, 4, 8, 64, 128, 256]
    assert COLUMNS == 128


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch_name", ["qwen2_5_vl", "qwen3_vl"])
def test_static_steps_give_the_eager_steps_tokens_and_logprobs(tiny, device, arch_name):
    b = tiny(arch_name)
    model = b.model.to(device)
    try:
        eager = EmbeddedEngine(model, b.tokenizer, graphs=False, prefix_cache_bytes=0)
        static = EmbeddedEngine(model, b.tokenizer, graphs=True, prefix_cache_bytes=0)
        want = generate(eager, b.renderer)
        got = generate(static, b.renderer)
        assert [len(g.token_ids) for g in got] == list(LENGTHS)
        assert_same(got, want, atol=1e-5)
        graphs = static._graphs
        assert graphs is not None and graphs.arena is not None
        columns = {c for _, c in graphs.slots}
        assert len(columns) == 1 and columns.pop() % COLUMNS == 0
        assert sorted(r for r, _ in graphs.slots) == [1, 2, 4, 8]  # the batch moved down as rows left
        if device == "cuda":
            assert all(s.graph is not None for s in graphs.slots.values())
        again = generate(static, b.renderer)  # the slots' graphs replayed for a second batch
        assert_same(again, want, atol=1e-5)
    finally:
        b.model.to("cpu")


def test_a_batch_past_the_arena_limit_decodes_eagerly(tiny):
    b = tiny("qwen2_5_vl")
    eager = EmbeddedEngine(b.model, b.tokenizer, graphs=False, prefix_cache_bytes=0)
    small = EmbeddedEngine(b.model, b.tokenizer, graphs=True, graph_bytes=1024, prefix_cache_bytes=0)
    assert_same(generate(small, b.renderer), generate(eager, b.renderer), atol=1e-5)
    assert small._graphs is not None and small._graphs.arena is None


def test_graphs_refuse_an_attention_whose_mask_they_cannot_build(tiny):
    from vlrl.models.load import load_model

    b = tiny("qwen2_5_vl")
    model = load_model(b.path, attention="eager")
    with pytest.raises(ValueError, match="graphs=True needs attention vlrl_sdpa or sdpa, the model has 'eager'"):
        EmbeddedEngine(model, b.tokenizer, graphs=True)
    assert EmbeddedEngine(model, b.tokenizer)._graphs is None  # the default leaves such a model eager


def test_replaced_parameters_retire_the_slots(tiny):
    b = tiny("qwen2_5_vl")
    engine = EmbeddedEngine(b.model, b.tokenizer, graphs=True, prefix_cache_bytes=0)
    first = generate(engine, b.renderer)
    slots = dict(engine._graphs.slots)
    head = b.model.lm_head  # outside the language model: a captured step reads it too
    original = head.weight
    try:
        head.weight = torch.nn.Parameter(original.detach().clone())  # same values, new storage
        assert_same(generate(engine, b.renderer), first, atol=1e-5)
        now = engine._graphs.slots
        assert set(now) == set(slots) and all(now[k] is not s for k, s in slots.items())
    finally:
        head.weight = original


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [7, 1025, 1409, 2049])  # 1025 ...: where the repeated-view kernel bug struck
def test_a_decode_step_attends_grouped_as_the_repeated_heads_do(device, length):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vlrl.models.attention import grouped_decode, repeat_heads

    g = torch.Generator(device=device).manual_seed(length)
    q = torch.randn(6, 8, 1, 32, device=device, generator=g)
    arena = torch.randn(2, 8, 2, length + 64, 32, device=device, generator=g)
    k, v = arena[0, :6, :, :length], arena[1, :6, :, :length]  # a slot's view: strided rows and columns
    mask = torch.ones(6, 1, 1, length, dtype=torch.bool, device=device)
    mask[1, ..., :5] = False  # left padding
    mask[3, ..., length // 2 :] = False  # columns not written yet
    got = grouped_decode(q, k, v, mask, 0.0, 0.2)
    with sdpa_kernel(SDPBackend.MATH):
        want = torch.nn.functional.scaled_dot_product_attention(
            q, repeat_heads(k, 4), repeat_heads(v, 4), attn_mask=mask, scale=0.2
        )
    assert got.shape == (6, 1, 8, 32)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=2e-6, rtol=1e-5)
