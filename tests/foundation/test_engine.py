"""Embedded engine: honest logprobs, no vision placeholders sampled, stops, seeds, weight updates."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.engines.types import SamplingParams
from vlrl.errors import ContextOverflowError
from vlrl.messages import image_part

VISION_IDS = {151652, 151653, 151654, 151655, 151656}


def rgb(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def prompts(renderer):
    single = [{"role": "user", "content": [image_part(rgb(90, 150, 1)), {"type": "text", "text": "Colour?"}]}]
    multi = [
        {
            "role": "user",
            "content": [image_part(rgb(64, 64, 2)), {"type": "text", "text": "vs"}, image_part(rgb(112, 80, 3))],
        },
        {"role": "assistant", "content": "hm"},
        {"role": "user", "content": [image_part(rgb(40, 120, 4)), {"type": "text", "text": "and this?"}]},
    ]
    return {"single": renderer.render(single), "multi": renderer.render(multi)}


def reference_logprobs(model, prompt, gen, temperature):
    """A separate full forward over prompt + generated tokens; positions computed by the model itself."""
    return full_forward_logprobs(model, prompt, gen.token_ids, temperature)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_equal_a_full_forward(tiny, arch, temperature):
    b = tiny(arch)
    ps = prompts(b.renderer)
    # batch both prompts together (left padding, different image counts) and with top-k/top-p on
    params = SamplingParams(temperature=temperature, max_tokens=24, seed=3, top_k=50, top_p=0.9, ignore_eos=True)
    gens = b.engine.generate(list(ps.values()), params)
    for (name, p), g in zip(ps.items(), gens):
        assert len(g.token_ids) == len(g.logprobs) == 24
        ref = reference_logprobs(b.model, p, g, temperature)
        diff = (ref - torch.tensor(g.logprobs)).abs().max().item()
        assert diff <= 1e-4, f"{name}: max |Δ| {diff}"


def test_never_samples_vision_placeholders_even_when_favoured(tiny, arch):
    b = tiny(arch)
    ids = torch.tensor(sorted(VISION_IDS))

    def rig(module, inputs, logits):  # fault injection: the vision ids get by far the largest logits
        return logits.index_add(-1, ids, torch.full((len(ids),), 100.0).expand(*logits.shape[:-1], -1))

    handle = b.model.get_output_embeddings().register_forward_hook(rig)
    try:
        p = prompts(b.renderer)["single"]
        h = torch.randn(1, b.model.get_output_embeddings().in_features)
        assert int(b.model.get_output_embeddings()(h).argmax()) in VISION_IDS, (
            "the rig did not make vision ids dominant"
        )
        # The contract leaves the vision ids out of the softmax, so even dominant ones do not move
        # the reported logprob: engine and reference still agree.
        g_check = b.engine.generate([p], SamplingParams(temperature=1.0, max_tokens=1, seed=0))[0]
        assert abs(g_check.logprobs[0] - reference_logprobs(b.model, p, g_check, 1.0).item()) <= 1e-4
        for params in [
            SamplingParams(temperature=0, max_tokens=16),
            SamplingParams(temperature=1.0, max_tokens=16, seed=1),
            SamplingParams(temperature=5.0, max_tokens=16, seed=2, top_k=3),
        ]:
            g = b.engine.generate([p], params)[0]
            assert not VISION_IDS.intersection(g.token_ids)
    finally:
        handle.remove()


def test_seed_reproducible_whatever_the_batch(tiny):
    b = tiny("qwen2_5_vl")
    ps = prompts(b.renderer)
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=123, ignore_eos=True)
    alone = b.engine.generate([ps["single"]], params)[0]
    together = b.engine.generate(
        [ps["multi"], ps["single"], ps["multi"]],
        [SamplingParams(seed=5, max_tokens=7), params, SamplingParams(seed=6, max_tokens=30)],
    )
    assert together[1].token_ids == alone.token_ids
    np.testing.assert_allclose(together[1].logprobs, alone.logprobs, atol=1e-5)
    other = b.engine.generate(
        [ps["single"]], SamplingParams(temperature=1.0, max_tokens=20, seed=124, ignore_eos=True)
    )[0]
    assert other.token_ids != alone.token_ids


def test_pipelined_decoding_takes_the_step_by_step_tokens_and_logprobs(tiny):
    """``pipelined`` (the CUDA default) queues each step's next forward before the host reads the step's tokens,
    so a finished row is fed one more token; on a CPU both orders run: every row, however it stops (eos, a stop
    id, a stop string cut, its length, greedy or sampled, with top logprobs), must come out the same."""
    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_5_vl")
    ps = prompts(b.renderer)
    _, full = _first_generation(b)
    stop = b.tokenizer.decode(full.token_ids[4:6], skip_special_tokens=True)[-2:]
    params = [
        SamplingParams(temperature=1.0, max_tokens=40, seed=11, ignore_eos=True, stop=(stop,)),
        SamplingParams(temperature=1.0, max_tokens=3, seed=5, logprobs_topk=4),
        SamplingParams(temperature=0.0, max_tokens=9, stop_token_ids=(full.token_ids[7],)),
        SamplingParams(temperature=0.7, max_tokens=12, seed=6, top_k=20),
        SamplingParams(temperature=1.0, max_tokens=40, seed=11, ignore_eos=True, stop_token_ids=(full.token_ids[7],)),
    ]
    batch = [ps["single"], ps["multi"], ps["single"], ps["multi"], ps["single"]]
    runs = {
        ahead: EmbeddedEngine(b.model, b.tokenizer, pipelined=ahead).generate(batch, params) for ahead in (False, True)
    }
    reasons = set()
    for step, ahead in zip(runs[False], runs[True], strict=True):
        assert (ahead.token_ids, ahead.text, ahead.finish_reason, ahead.stop_reason) == (
            step.token_ids,
            step.text,
            step.finish_reason,
            step.stop_reason,
        )
        np.testing.assert_allclose(ahead.logprobs, step.logprobs, atol=1e-5)
        assert [[t for t, _ in top] for top in ahead.top_logprobs] == [[t for t, _ in top] for top in step.top_logprobs]
        for a, b in zip(ahead.top_logprobs, step.top_logprobs, strict=True):
            np.testing.assert_allclose([v for _, v in a], [v for _, v in b], atol=1e-5)
        reasons.add((step.finish_reason, type(step.stop_reason).__name__))
    assert {("stop", "str"), ("stop", "int"), ("length", "NoneType")} <= reasons, reasons


def test_top_k_one_is_greedy(tiny):
    b = tiny("qwen3_vl")
    p = prompts(b.renderer)["multi"]
    greedy = b.engine.generate([p], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    topk1 = b.engine.generate([p], SamplingParams(temperature=0.5, top_k=1, max_tokens=12, seed=9, ignore_eos=True))[0]
    assert greedy.token_ids == topk1.token_ids


def _first_generation(b, n=40):
    p = prompts(b.renderer)["single"]
    return p, b.engine.generate([p], SamplingParams(temperature=1.0, max_tokens=n, seed=11, ignore_eos=True))[0]


@pytest.mark.parametrize("include", [True, False])
def test_stop_strings(tiny, include):
    b = tiny("qwen2_5_vl")
    p, full = _first_generation(b)
    tok = b.tokenizer
    # choose a stop string that straddles tokens 5 and 6 of the unconstrained output
    t5, t6 = (
        tok.decode(full.token_ids[:5], skip_special_tokens=True),
        tok.decode(full.token_ids[:6], skip_special_tokens=True),
    )
    stop = t6[len(t5) - 1 :] if len(t5) else t6
    stop = stop[-3:] if len(stop) > 3 else stop
    params = SamplingParams(
        temperature=1.0, max_tokens=40, seed=11, stop=(stop,), include_stop_str_in_output=include, ignore_eos=True
    )
    g = b.engine.generate([p], params)[0]
    assert g.finish_reason == "stop" and g.stop_reason == stop
    assert len(g.token_ids) == len(g.logprobs)
    assert tok.decode(g.token_ids, skip_special_tokens=True) == g.text
    first = full.text.find(stop)
    if include:
        assert stop in g.text and g.text.find(stop) == first
        assert full.token_ids[: len(g.token_ids)] == g.token_ids
    else:
        assert stop not in g.text and len(g.text) <= first
        assert full.token_ids[: len(g.token_ids)] == g.token_ids


def test_stop_token_ids_and_length(tiny):
    b = tiny("qwen2_vl")
    p, full = _first_generation(b)
    target = full.token_ids[7]
    g = b.engine.generate(
        [p], SamplingParams(temperature=1.0, max_tokens=40, seed=11, stop_token_ids=(target,), ignore_eos=True)
    )[0]
    assert g.finish_reason == "stop" and g.stop_reason == target
    assert g.token_ids[-1] == target and target not in g.token_ids[:-1]
    short = b.engine.generate([p], SamplingParams(temperature=1.0, max_tokens=5, seed=11, ignore_eos=True))[0]
    assert short.finish_reason == "length" and short.token_ids == full.token_ids[:5]


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_non_finite_row_fails_its_batch_naming_the_row(tiny, pipelined):
    """The engine queues a step's sampling without reading the device first (pipelined: and the next forward,
    fed a placeholder for the unsampled row); a row whose logits are NaN still fails the call, named, and the
    engine serves the next call."""
    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_vl")
    engine = EmbeddedEngine(b.model, b.tokenizer, pipelined=pipelined)
    p = prompts(b.renderer)["single"]
    norm = b.model.model.language_model.norm

    def poison(module, args, out):
        out = out.clone()
        out[1] = float("nan")
        return out

    hook = norm.register_forward_hook(poison)
    try:
        with pytest.raises(RuntimeError, match=r"rows \[1\] are not finite"):
            engine.generate([p, p], SamplingParams(temperature=1.0, max_tokens=3, seed=1))
    finally:
        hook.remove()
    assert len(engine.generate([p], SamplingParams(temperature=1.0, max_tokens=3, seed=1))[0].token_ids) == 3


def test_context_overflow_is_a_clear_error(tiny):
    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_vl")
    small = EmbeddedEngine(b.model, b.tokenizer, max_context=16)
    p = prompts(b.renderer)["single"]
    with pytest.raises(ContextOverflowError, match=r"prompt has \d+ tokens, more than the context limit of 16"):
        small.generate([p])
    roomy = EmbeddedEngine(b.model, b.tokenizer, max_context=len(p) + 3)
    g = roomy.generate([p], SamplingParams(max_tokens=50, seed=0, ignore_eos=True))[0]
    assert len(g.token_ids) == 3 and g.finish_reason == "length"


def test_concurrent_requests_from_coroutines(tiny):
    b = tiny("qwen2_5_vl")
    ps = prompts(b.renderer)

    async def many():
        return await asyncio.gather(
            *[
                b.engine.agenerate(ps["single" if i % 2 else "multi"], SamplingParams(seed=i, max_tokens=6))
                for i in range(12)
            ]
        )

    outs = asyncio.run(many())
    solo = b.engine.generate([ps["single"]], SamplingParams(seed=3, max_tokens=6))[0]
    assert len(outs) == 12 and outs[3].token_ids == solo.token_ids


def test_update_weights_in_memory(tiny):
    b = tiny("qwen3_vl")
    e = b.engine
    p = prompts(b.renderer)["single"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before, sum_before = e.generate([p], params)[0], e.weights_checksum()
    name = (
        "lm_head.weight"
        if "lm_head.weight" in dict(e.model.named_parameters())
        else "model.language_model.embed_tokens.weight"
    )
    old = dict(e.model.named_parameters())[name].detach().clone()
    try:
        v = e.update_weights({name: old + torch.randn_like(old) * 0.5})
        after = e.generate([p], params)[0]
        assert v == before.weight_version + 1 == after.weight_version
        assert e.weights_checksum() != sum_before and after.logprobs != before.logprobs
        with pytest.raises(KeyError, match="no parameter 'nope'"):
            e.update_weights({"nope": old})
    finally:
        e.update_weights({name: old})
    assert e.weights_checksum() == sum_before
    assert e.generate([p], params)[0].token_ids == before.token_ids
