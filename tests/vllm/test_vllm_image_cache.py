"""A generate request sends each image's tensors to a server once; later requests reference them by hash
(``vlrl.vllm.image_cache``); a reset vlrl sends makes it forget (no miss); a reset by someone else is a miss:
on vLLM 0.32 the whole request goes again, on 0.26 (whose engine dies on a miss) the error names the cause."""

from __future__ import annotations

import json

import pytest
from vllm_cases import conversations, forget_cached_prefixes

from vlrl.engines.types import SamplingParams
from vlrl.vllm.client import GENERATE
from vlrl.vllm.server import VllmServerError

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"
MESSAGES = conversations()["several_images"][0]


def test_images_go_once_then_by_hash_and_vlrls_own_resets_send_them_whole(vllm_stack, monkeypatch):
    stack = vllm_stack(ARCH)
    engine, client = stack.engine, stack.engine.client
    engine.clear_caches()  # a fresh start for the server's caches and the engine's belief
    by_reference, misses = engine.images.sent_by_reference, engine.images.misses  # the stack is shared
    sizes: list[int] = []
    post = client.post

    async def spy(url, path, body, *, what):
        if path == GENERATE and body.get("features"):  # image requests (not the ban probe a fresh engine sends)
            sizes.append(len(json.dumps(body)))
        return await post(url, path, body, what=what)

    monkeypatch.setattr(client, "post", spy)
    prompt = stack.renderer.render(MESSAGES)
    assert prompt.n_images >= 2
    sp = SamplingParams(max_tokens=8, seed=5)
    first = engine.generate([prompt], sp)[0]
    forget_cached_prefixes(engine)  # the images stay cached; the prompt is prefilled whole again
    second = engine.generate([prompt], sp)[0]  # the next turn re-sends the same images
    assert second.token_ids == first.token_ids and second.logprobs == first.logprobs
    assert sizes[1] < 0.05 * sizes[0], sizes  # tensors left out: a reference by hash
    assert engine.images.sent_by_reference - by_reference == prompt.n_images

    engine.clear_caches()  # vlrl's own reset: the engine forgets what the server dropped, so no miss
    third = engine.generate([prompt], sp)[0]
    assert third.token_ids == first.token_ids and engine.images.misses == misses
    assert sizes[2] == sizes[0], sizes

    engine.reload_checkpoint()  # a sync's /pause clears the server's cache: the engine must forget, not miss
    fourth = engine.generate([prompt], sp)[0]
    assert fourth.token_ids == first.token_ids and engine.images.misses == misses
    assert sizes[3] == sizes[0], sizes


def test_a_reset_behind_vlrls_back_is_a_retry_or_a_named_error(vllm_stack):
    stack = vllm_stack(ARCH)
    engine, client = stack.engine, stack.engine.client
    engine.clear_caches()
    misses = engine.images.misses
    prompt = stack.renderer.render(MESSAGES)
    sp = SamplingParams(max_tokens=8, seed=5)
    first = engine.generate([prompt], sp)[0]
    client.run(client.post(stack.url, "/reset_mm_cache", {}, what="forget"))  # as an eviction would
    if client.capabilities().cache_miss_recoverable:  # 0.32: HTTP 500, then the whole request again
        forget_cached_prefixes(engine)  # prefilled whole, as the first run was
        again = engine.generate([prompt], sp)[0]
        assert again.token_ids == first.token_ids and again.logprobs == first.logprobs
        assert engine.images.misses - misses == 1
    else:  # 0.26: the engine core asserts on the miss and dies; the error says why, and the server is gone
        with pytest.raises(VllmServerError, match="lost an image this request named by hash"):
            engine.generate([prompt], sp)
        stack.close()  # the next test that asks for this arch gets a fresh server
