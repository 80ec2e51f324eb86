"""A generate request sends each image's tensors to a server once; later requests reference them by hash
(``vlrl.vllm.image_cache``), and a server that forgot them is sent the whole request again."""

from __future__ import annotations

import json

import pytest
from vllm_cases import conversations

from vlrl.engines.types import SamplingParams
from vlrl.vllm.client import GENERATE

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"
MESSAGES = conversations()["several_images"][0]


def test_images_go_once_then_by_hash_and_a_forgetful_server_gets_them_again(vllm_stack, monkeypatch):
    stack = vllm_stack(ARCH)
    engine, client = stack.engine, stack.engine.client
    engine.clear_caches()  # a fresh start for the server's caches and the engine's belief
    by_reference, misses = engine.images.sent_by_reference, engine.images.misses  # the stack is shared
    sizes: list[int] = []
    post = client.post

    async def spy(url, path, body, *, what):
        if path == GENERATE:
            sizes.append(len(json.dumps(body)))
        return await post(url, path, body, what=what)

    monkeypatch.setattr(client, "post", spy)
    prompt = stack.renderer.render(MESSAGES)
    assert prompt.n_images >= 2
    sp = SamplingParams(max_tokens=8, seed=5)
    first = engine.generate([prompt], sp)[0]
    second = engine.generate([prompt], sp)[0]  # the next turn re-sends the same images
    assert second.token_ids == first.token_ids and second.logprobs == first.logprobs
    assert sizes[1] < 0.05 * sizes[0], sizes  # tensors left out: a reference by hash
    assert engine.images.sent_by_reference - by_reference == prompt.n_images

    client.run(client.post(stack.url, "/reset_mm_cache", {}, what="forget"))  # as an eviction would
    third = engine.generate([prompt], sp)[0]
    assert third.token_ids == first.token_ids and third.logprobs == first.logprobs
    assert engine.images.misses - misses == 1
    assert sizes[2] < 0.05 * sizes[0] and sizes[3] == sizes[0], sizes  # the miss, then everything again

    engine.reload_checkpoint()  # a sync's /pause clears the server's cache: the engine must forget, not miss
    fourth = engine.generate([prompt], sp)[0]
    assert fourth.token_ids == first.token_ids and engine.images.misses - misses == 1
    assert sizes[4] == sizes[0], sizes
