"""A server that dies mid-batch gives clear errors (no hang); what completed before is kept."""

from __future__ import annotations

import time

import pytest

from vllm_cases import conversations
from vlrl.engines.types import SamplingParams
from vlrl.engines.vllm_server import VllmServerError

pytestmark = pytest.mark.vllm
ARCH = "qwen2_vl"  # its only server: render check, a finished batch, then killed mid-batch


def test_killed_server_mid_batch(vllm_stack, tiny):
    stack = vllm_stack(ARCH)
    messages = conversations()["one_image"][0]
    prompt = stack.renderer.render(messages)
    assert prompt.token_ids == tiny(ARCH).renderer.render(messages).token_ids
    done = stack.engine.generate([prompt] * 2, SamplingParams(max_tokens=4, seed=0))
    futures = [stack.engine.client.submit(stack.engine._agenerate(prompt, SamplingParams(
        max_tokens=3000, ignore_eos=True, seed=i), None)) for i in range(4)]
    time.sleep(1.5)
    stack.servers[0].kill()
    t0 = time.monotonic()
    for f in futures:
        with pytest.raises(VllmServerError, match=stack.url):
            f.result(timeout=60)
    assert time.monotonic() - t0 < 30
    assert all(len(g.token_ids) == 4 and g.finish_reason == "length" for g in done)  # kept, untouched
    with pytest.raises(VllmServerError, match="unreachable"):
        stack.engine.generate([prompt], SamplingParams(max_tokens=2))
