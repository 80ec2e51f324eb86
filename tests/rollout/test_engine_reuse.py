"""The embedded engine's reuse (``vlrl.engines.reuse``): multi-turn rollouts served from cached image features
and cached conversation-prefix keys / values sample with the logprobs of a fresh forward, the vision tower
runs once per distinct image, and changed weights never meet stale caches."""

from __future__ import annotations

import pytest
import torch
from rollout_env import probe_row

from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.engines.embedded import EmbeddedEngine
from vlrl.engines.types import SamplingParams
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

FP32_BOUND = 1e-4


class RecordingEngine(EmbeddedEngine):
    """The real engine; each request's prompt and generation are kept for the checks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records: list = []

    async def agenerate(self, prompt, params=SamplingParams()):
        gen = await super().agenerate(prompt, params)
        self.records.append((prompt, gen))
        return gen


def count_encoded_images(monkeypatch, model) -> list[int]:
    """``[n]``: images the vision tower has been given since (its grids' rows), counted on the real tower."""
    visual, seen = model.model.visual, [0]
    forward = visual.forward

    def counting(pixels, grid_thw=None, **kwargs):
        seen[0] += int(grid_thw.shape[0])
        return forward(pixels, grid_thw=grid_thw, **kwargs)

    monkeypatch.setattr(visual, "forward", counting)
    return seen


def rollout(bundle, engine):
    cfg = RolloutConfig(sampling=SamplingParams(temperature=1.0, max_tokens=6), repeats=2, seed=5, progress=False)
    rows = [probe_row(["image", "image", "two_images"], seed=1), probe_row(["image", "text"], seed=2)]
    return RolloutGenerator(bundle.renderer, engine, cfg).run(rows)


@pytest.mark.parametrize(  # qwen3_vl: deepstack features reused too; pipelined: the CUDA decode order; graphs:
    ("arch_name", "pipelined", "graphs"),  # CUDA's static decode steps (vlrl.engines.graphs), here run eagerly
    [("qwen2_5_vl", False, False), ("qwen3_vl", False, False), ("qwen2_5_vl", True, False), ("qwen2_5_vl", True, True)],
)
def test_reused_turns_sample_fresh_forward_logprobs_and_encode_each_image_once(
    tiny, probe_env, monkeypatch, arch_name, pipelined, graphs
):
    b = tiny(arch_name)
    engine = RecordingEngine(b.model, b.tokenizer, pipelined=pipelined, graphs=graphs)
    encoded = count_encoded_images(monkeypatch, b.model)
    trajs = rollout(b, engine)
    assert all(t.error is None for t in trajs) and max(len(t.turns) for t in trajs) == 4
    distinct = {h for p, _ in engine.records for h in p.image_hashes}
    assert encoded[0] == engine.stats["images_encoded"] == len(distinct), (encoded, len(distinct))
    assert engine.stats["reused_columns"] > 0  # later turns start from their previous turn's keys / values
    worst = 0.0
    for prompt, gen in engine.records:
        ref = full_forward_logprobs(b.model, prompt, gen.token_ids, 1.0)
        worst = max(worst, (ref - torch.tensor(gen.logprobs)).abs().max().item())
    assert worst <= FP32_BOUND, f"reused turns vs a fresh full forward: max |Δ| {worst}"


def test_cached_path_equals_the_uncached_engine_and_weight_changes_clear_it(tiny, probe_env):
    b = tiny("qwen2_5_vl")
    model = b.model
    engine = RecordingEngine(model, b.tokenizer)
    rollout(b, engine)
    last = [p for p, _ in engine.records if p.n_images >= 3]  # the latest turns: every earlier image and reply
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=11, ignore_eos=True, logprobs_topk=5)
    uncached = EmbeddedEngine(model, b.tokenizer, image_cache_bytes=0, prefix_cache_bytes=0)

    def agree(a, c):
        for x, y in zip(a, c):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) <= FP32_BOUND

    before = dict(engine.stats)
    agree(engine.generate(last, params), uncached.generate(last, params))
    assert engine.stats["reused_columns"] > before["reused_columns"] and uncached.stats["reused_columns"] == 0
    assert engine.stats["images_encoded"] == before["images_encoded"]  # every image of these prompts was cached

    head = model.get_output_embeddings().weight
    emb = "model.visual.merger.mlp.2.weight"  # the vision projector: stale image features would keep the old one
    original = {emb: dict(model.named_parameters())[emb].detach().clone(), "head": head.detach().clone()}
    try:
        engine.update_weights({emb: original[emb] * 1.5})
        with torch.no_grad():
            head.mul_(1.01)  # an in-place write without update_weights (a trainer sharing the model) counts too
        agree(engine.generate(last, params), uncached.generate(last, params))
    finally:
        with torch.no_grad():
            dict(model.named_parameters())[emb].copy_(original[emb])
            head.copy_(original["head"])


def test_a_row_that_ends_first_in_a_pipelined_batch_is_reused_at_its_own_columns(tiny):
    """Pipelined decoding feeds a row that finishes while others go on its last token too, so the cache holds one
    more of its columns than a step-by-step decode leaves: the row's prefix entry must take them with their tokens
    (a next turn built on it samples the uncached engine's tokens and logprobs)."""
    import numpy as np

    from vlrl.messages import image_part

    b = tiny("qwen2_5_vl")
    engine = EmbeddedEngine(b.model, b.tokenizer, pipelined=True)
    uncached = EmbeddedEngine(b.model, b.tokenizer, image_cache_bytes=0, prefix_cache_bytes=0)
    image = np.random.default_rng(4).integers(0, 256, size=(168, 224, 3), dtype=np.uint8)  # > a BLOCK of tokens
    first = [{"role": "user", "content": [image_part(image), {"type": "text", "text": "What is it?"}]}]
    other = [{"role": "user", "content": [{"type": "text", "text": "A longer reply, please."}]}]
    short, long = engine.generate(
        [b.renderer.render(first), b.renderer.render(other)],
        [SamplingParams(max_tokens=3, seed=1, ignore_eos=True), SamplingParams(max_tokens=9, seed=2, ignore_eos=True)],
    )
    assert len(short.token_ids) == 3 and len(long.token_ids) == 9  # the short row ended while the long went on
    follow = b.renderer.render(
        first + [{"role": "assistant", "content": short.text}, {"role": "user", "content": "So?"}]
    )
    before = engine.stats["reused_columns"]
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3, ignore_eos=True)
    got, ref = engine.generate([follow], params)[0], uncached.generate([follow], params)[0]
    assert engine.stats["reused_columns"] > before
    assert got.token_ids == ref.token_ids
    assert max(abs(p - q) for p, q in zip(got.logprobs, ref.logprobs)) <= FP32_BOUND


@pytest.mark.parametrize("stack_bytes", [1, 1 << 30])
def test_finished_rows_keep_their_own_last_columns_however_many_stack_at_once(monkeypatch, stack_bytes):
    """``prefix_entries`` takes finished rows together (as many as fit in ``STACK_BYTES``): each entry holds its
    row's last ``len(prompt) + len(fed)`` columns of every layer, copied out of the stack."""
    from types import SimpleNamespace

    from transformers import DynamicCache

    from vlrl.engines import reuse

    monkeypatch.setattr(reuse, "STACK_BYTES", stack_bytes)
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache()
    kv = [(torch.randn(4, 2, 9, 3, generator=g), torch.randn(4, 2, 9, 3, generator=g)) for _ in range(3)]
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    finished = [
        (SimpleNamespace(token_ids=(1, 2, 3), placeholders=(), image_hashes=()), (7, 8), 2),
        (SimpleNamespace(token_ids=tuple(range(6)), placeholders=(), image_hashes=()), (9,), 0),
        (SimpleNamespace(token_ids=(5,), placeholders=(), image_hashes=()), (), 3),
    ]
    entries = reuse.prefix_entries(finished, cache)
    for (prompt, fed, row), entry in zip(finished, entries, strict=True):
        n = len(prompt.token_ids) + len(fed)
        assert entry.token_ids == tuple(prompt.token_ids) + tuple(fed)
        assert torch.equal(entry.keys, torch.stack([k[row, :, -n:] for k, _ in kv]))
        assert torch.equal(entry.values, torch.stack([v[row, :, -n:] for _, v in kv]))
        assert entry.keys.is_contiguous() and entry.keys.untyped_storage().nbytes() == entry.keys.nbytes
