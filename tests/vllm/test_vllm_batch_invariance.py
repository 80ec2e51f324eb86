"""Batch invariance against vLLM (``vlrl.checks.batch_invariance``): a prompt's logprobs generated alone equal its
logprobs inside batches of other prompts (other lengths and image counts, any order), within the server dtype's
bound. vLLM batches what it is sent as its scheduler decides; every call starts from empty prefix and encoder
caches, so the batched prefill is computed, not read back from the alone run."""

from __future__ import annotations

import numpy as np
import pytest
from vllm_cases import check_seeded_requests_past_one_step

from vlrl.checks.batch_invariance import check_batch_invariance
from vlrl.messages import image_part

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"


def _prompt(renderer, words: int, images: int, seed: int):
    rng = np.random.default_rng(seed)
    parts = [image_part(rng.integers(0, 256, (56 + 28 * k, 84, 3), dtype=np.uint8)) for k in range(images)]
    text = " ".join(f"w{(seed + i) % 97}" for i in range(words))
    return renderer.render([{"role": "user", "content": [*parts, {"type": "text", "text": text}]}])


def test_vllm_logprobs_do_not_depend_on_the_batch(vllm_stack):
    stack = vllm_stack(ARCH)
    specs = [(180, 2), (12, 0), (70, 1), (30, 1)]  # distinct lengths, 0-2 images each
    prompts = [_prompt(stack.renderer, w, k, seed=i) for i, (w, k) in enumerate(specs)]
    assert len({len(p) for p in prompts}) == len(prompts)
    pairs = [[0, j] for j in range(1, len(prompts))]  # the longest next to each other one
    report = check_batch_invariance(
        stack.engine, prompts, arrangements=[range(4), [3, 1, 0, 2], *pairs], dtype="float32", max_tokens=4
    )
    assert report.n_positions >= 2 * (len(prompts) + len(pairs))  # every first token compared, at least
    report.raise_if_failed()
    assert report.first_token_max_abs <= report.bound


def test_seeded_requests_past_one_steps_token_budget(vllm_stack):
    stack = vllm_stack(ARCH)
    check_seeded_requests_past_one_step(stack.engine, stack.renderer)
