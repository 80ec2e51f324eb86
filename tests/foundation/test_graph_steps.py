"""The embedded engine's static decode steps (``vlrl.engines.graphs``): CUDA graph replays on a GPU, the same
step eagerly elsewhere. A request's tokens and logprobs are those of the eager path (``DynamicSteps``) whatever
slot its batch decodes in, as rows leave and the batch moves to smaller slots."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vlrl.engines import graphs as graphs_module
from vlrl.engines.embedded import EmbeddedEngine
from vlrl.engines.graphs import COLUMNS, DecodeGraphs, bucket
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


def fake_cache():
    """One layer, one kv head of width 4, fp32: 32 bytes of keys and values per (row, column)."""
    return SimpleNamespace(layers=[SimpleNamespace(keys=torch.zeros(1, 1, 1, 4))])


def test_the_arena_grows_to_hold_both_batches_or_else_the_new_one_alone():
    graphs = DecodeGraphs(max_bytes=32 * 8 * 256)
    assert graphs._arena_for(fake_cache(), 8, 256)
    assert graphs._arena_for(fake_cache(), 4, 128) and (graphs.arena.rows, graphs.arena.cols) == (8, 256)
    assert graphs._arena_for(fake_cache(), 2, 1024)  # 8 x 1024 would not fit, 2 x 1024 does
    assert (graphs.arena.rows, graphs.arena.cols) == (2, 1024)
    assert not graphs._arena_for(fake_cache(), 16, 1024)


def test_the_least_recently_used_slot_goes_first(monkeypatch):
    monkeypatch.setattr(graphs_module, "MAX_SLOTS", 2)
    graphs = DecodeGraphs(max_bytes=1 << 20)
    graphs._arena_for(fake_cache(), 8, 256)
    first = graphs._slot(8, 128)
    graphs._slot(4, 128)
    assert graphs._slot(8, 128) is first  # used again: now the most recent
    graphs._slot(2, 128)
    assert list(graphs.slots) == [(8, 128), (2, 128)]


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
    with pytest.raises(ValueError, match="graphs=True: graphs need attention vlrl_sdpa or sdpa, the model has 'eager'"):
        EmbeddedEngine(model, b.tokenizer, graphs=True)
    assert EmbeddedEngine(model, b.tokenizer)._graphs is None  # the default leaves such a model eager


@pytest.mark.parametrize("device", DEVICES)
def test_replaced_parameters_retire_the_slots(tiny, device):
    b = tiny("qwen2_5_vl")
    model = b.model.to(device)
    head = model.lm_head  # outside the language model: a captured step reads it too
    original = head.weight
    try:
        static = EmbeddedEngine(model, b.tokenizer, graphs=True, prefix_cache_bytes=0)
        generate(static, b.renderer)
        slots = dict(static._graphs.slots)
        with torch.no_grad():  # other values in new storage: a graph still reading the old one would differ
            head.weight = torch.nn.Parameter(original.detach() * 1.5)
        eager = EmbeddedEngine(model, b.tokenizer, graphs=False, prefix_cache_bytes=0)
        assert_same(generate(static, b.renderer), generate(eager, b.renderer), atol=1e-5)
        now = static._graphs.slots
        assert set(now) == set(slots) and all(now[k] is not s for k, s in slots.items())
    finally:
        head.weight = original
        b.model.to("cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_slots_serve_other_widths_the_prefix_cache_and_rows_leaving_from_the_end(tiny, device):
    b = tiny("qwen2_5_vl")
    model = b.model.to(device)
    ps = prompts(b.renderer)
    calls = [  # (prompts, new tokens per row)
        ([ps["single"], ps["multi"], ps["single"]], (6, 9, 4)),
        ([ps["single"]] * 2, (8, 8)),  # a narrower batch in the same slot (one column block)
        ([ps["multi"], ps["single"], ps["multi"]], (5, 7, 6)),  # prefixes cached by the first call
        # 8 rows: the last two leave first (7 then 6 rows in the 8-row slot, then rows 0..5 again)
        ([ps["single"], ps["multi"]] * 4, (10, 10, 10, 10, 10, 10, 3, 5)),
    ]
    try:
        static = EmbeddedEngine(model, b.tokenizer, graphs=True)
        eager = EmbeddedEngine(model, b.tokenizer, graphs=False)
        for k, (batch_prompts, lengths) in enumerate(calls):
            params = [
                SamplingParams(temperature=1.0, max_tokens=n, seed=k * 10 + j, ignore_eos=True)
                for j, n in enumerate(lengths)
            ]
            assert_same(static.generate(batch_prompts, params), eager.generate(batch_prompts, params), atol=1e-5)
        assert static.stats["reused_columns"] == eager.stats["reused_columns"] > 0
        batch_prompts, lengths = calls[0]
        width = max(len(p.token_ids) for p in batch_prompts)
        for keys in static._graphs.arena.keys:  # a diverged batch's keys: masked columns must not carry them on
            keys[:, :, width:].fill_(float("nan"))
        params = [SamplingParams(temperature=1.0, max_tokens=n, seed=j, ignore_eos=True) for j, n in enumerate(lengths)]
        assert_same(static.generate(batch_prompts, params), eager.generate(batch_prompts, params), atol=1e-5)
    finally:
        b.model.to("cpu")


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
