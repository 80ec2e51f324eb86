"""Token-in/token-out generation through vLLM: the logprob contract, greedy, stops, splices."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from vllm_cases import conversations

from vlrl.checks.logprobs import full_forward_logprobs
from vlrl.engines.types import SamplingParams
from vlrl.errors import BadInputError
from vlrl.render.types import PlaceholderRange

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"  # for the tests here that take no arch parameter
TOL = 1e-4
MESSAGES = conversations()["several_images"][0]


def _max_delta(model, prompt, gen, temperature) -> float:
    ref = full_forward_logprobs(model, prompt, gen.token_ids, temperature)
    return (ref - torch.tensor(gen.logprobs)).abs().max().item()


def _spliced(prompt, prefix: tuple[int, ...]):
    """What a rollout does: new token history, placeholders shifted, vision tensors and payloads kept."""
    shift = len(prefix)
    return dataclasses.replace(
        prompt,
        token_ids=prefix + prompt.token_ids,
        placeholders=tuple(PlaceholderRange(p.offset + shift, p.length) for p in prompt.placeholders),
    )


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_full_forward(vllm_stack, tiny, arch, temperature):
    stack, model = vllm_stack(arch), tiny(arch).model
    prompt = stack.renderer.render(MESSAGES)
    prefix = tuple(
        tiny(arch).renderer.render([{"role": "system", "content": "Be brief."}], add_generation_prompt=False).token_ids
    )
    spliced = _spliced(prompt, prefix)
    params = SamplingParams(temperature=temperature, max_tokens=24, seed=7, ignore_eos=True)
    gens = stack.engine.generate([prompt, spliced], params)
    for p, g in zip([prompt, spliced], gens):
        assert len(g.token_ids) == 24 and g.finish_reason == "length" and g.prompt_len == len(p)
        assert _max_delta(model, p, g, temperature) <= TOL


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_greedy_equals_embedded(vllm_stack, tiny, arch):
    stack, bundle = vllm_stack(arch), tiny(arch)
    params = SamplingParams(temperature=0.0, max_tokens=32)
    got = stack.engine.generate([stack.renderer.render(MESSAGES)], params)[0]
    want = bundle.engine.generate([bundle.renderer.render(MESSAGES)], params)[0]
    assert got.token_ids == want.token_ids
    assert (got.finish_reason, got.stop_reason, got.text) == (want.finish_reason, want.stop_reason, want.text)
    assert _max_delta(bundle.model, stack.renderer.render(MESSAGES), got, 0.0) <= TOL


def test_stops_match_embedded(vllm_stack, tiny):
    stack, bundle = vllm_stack("qwen2_5_vl"), tiny("qwen2_5_vl")
    prompt = stack.renderer.render(MESSAGES)
    base = stack.engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))[0]
    stop_str = base.text[len(base.text) // 2 : len(base.text) // 2 + 2]
    stop_tok = base.token_ids[5]
    cases = [
        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, stop=(stop_str,)),
        SamplingParams(
            temperature=0.0, max_tokens=32, ignore_eos=True, stop=(stop_str,), include_stop_str_in_output=False
        ),
        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, stop_token_ids=(stop_tok,)),
    ]
    got = stack.engine.generate([prompt] * 3, cases)
    want = bundle.engine.generate([bundle.renderer.render(MESSAGES)] * 3, cases)
    for g, w in zip(got, want):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
            w.token_ids,
            w.text,
            w.finish_reason,
            w.stop_reason,
        )
        assert g.finish_reason == "stop"
    assert stop_str in got[0].text and stop_str not in got[1].text


def test_seeds_async_and_refusals(vllm_stack):
    engine = vllm_stack("qwen2_5_vl").engine
    prompt = vllm_stack("qwen2_5_vl").renderer.render(MESSAGES)
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=s) for s in (1, 2, 1)]
    sync = engine.generate([prompt] * 3, params)
    assert sync[0].token_ids == sync[2].token_ids != sync[1].token_ids

    async def many():
        return await asyncio.gather(*(engine.agenerate(prompt, p, route_key=i) for i, p in enumerate(params)))

    assert [g.token_ids for g in asyncio.run(many())] == [g.token_ids for g in sync]
    with pytest.raises(ValueError, match="allow_truncation"):
        engine.generate([prompt], SamplingParams(top_k=5))
    bad = dataclasses.replace(
        prompt, placeholders=tuple(PlaceholderRange(p.offset + 1, p.length) for p in prompt.placeholders)
    )
    with pytest.raises(BadInputError, match="does not cover"):
        engine.generate([bad], SamplingParams(max_tokens=2))
    routed = vllm_stack("qwen2_5_vl").server_renderer.render(MESSAGES)
    with pytest.raises(BadInputError, match="2 images but 4 vLLM image payloads"):
        engine.generate([dataclasses.replace(routed, engine_features=routed.engine_features * 2)], SamplingParams())
