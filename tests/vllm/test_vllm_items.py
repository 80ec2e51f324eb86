"""``rollout.renderer=embedded`` (the stack's default): vLLM generates from the trainer's own tensors.

The engine builds each image's vLLM item from the prompt's ``pixel_values`` (``vlrl.vllm.items``), laid out as
the server's own render lays it out; the answer must be the one the server's render route gives."""

from __future__ import annotations

import pytest
from vllm_cases import conversations, forget_cached_prefixes

from vlrl.engines.types import SamplingParams
from vlrl.render.embedded import EmbeddedRenderer

pytestmark = pytest.mark.vllm
N_SERVERS = {"qwen2_vl": 2}  # as the render tests, so the running stacks are reused


def test_embedded_prompts_generate_what_the_render_route_does(vllm_stack, arch):
    stack = vllm_stack(arch, N_SERVERS.get(arch, 1))
    assert isinstance(stack.renderer, EmbeddedRenderer)
    agreement = stack.render_agreement  # the start-up check of the two renderers
    assert agreement is not None and agreement.images == 1 and agreement.pixel_max_abs == 0.0
    for name in ("multi_turn",):  # two images over two turns, a system prompt (CI time: one conversation an arch)
        messages = conversations()[name][0]
        ours, routed = stack.renderer.render(messages), stack.server_renderer.render(messages)
        assert ours.token_ids == routed.token_ids and not ours.engine_features and routed.engine_features
        sp = SamplingParams(temperature=1.0, max_tokens=12, seed=7, logprobs_topk=3)
        a, b = stack.engine.generate([ours, routed], sp)
        assert a.token_ids == b.token_ids, name
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-6, name
        assert a.top_logprobs == b.top_logprobs or all(
            [t for t, _ in x] == [t for t, _ in y] for x, y in zip(a.top_logprobs, b.top_logprobs)
        ), name


@pytest.mark.parametrize("arch", ["qwen2_5_vl"])  # grouped with that arch's tests: its server starts once
def test_an_engine_without_a_stack_reads_the_item_layout_itself(vllm_stack, arch):
    """A ``VllmEngine`` a user builds over running servers (no stack to set its codec) asks the server once."""
    from vlrl.vllm.engine import VllmEngine

    stack = vllm_stack(arch)
    engine = VllmEngine.from_pretrained(stack.engine.model_dir, stack.engine.client, model=stack.engine.model)
    assert engine.item_codec is None
    prompt = stack.renderer.render(conversations()["one_image"][0])
    sp = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    got = engine.generate([prompt], sp)[0]
    forget_cached_prefixes(stack.engine)  # both runs prefill the whole prompt
    want = stack.engine.generate([prompt], sp)[0]
    assert engine.item_codec is not None and engine.item_codec.pixel_dtype == stack.engine.item_codec.pixel_dtype
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs
