"""Batch invariance of the embedded engine as a property: for prompts of any lengths and image counts, a
prompt's logprobs alone equal its logprobs inside any batch, in any order, within the dtype's bound.

Runs on CPU in the default suite and on CUDA under ``-m gpu``, for fp32 and bf16, on a model with one kv
head (``tiny``) and one with grouped kv heads (``tiny_kv2``). Batch widths ≡ 1 mod 64 are drawn on
purpose: on an H100 the SDPA kernel that transformers' own attention reached returned a wrong last row
there (``vlrl.models.attention``; ``tests/gpu/test_gpu_kernels.py`` shows this check catching it).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from invariance_cases import BAD_WIDTHS, close_stacks, prompt_of_length, stack

from vlrl.checks.batch_invariance import check_batch_invariance

CASES = [
    pytest.param(size, dtype, "cpu", id=f"cpu-{size}-{dtype}")
    for size in ("tiny", "tiny_kv2")
    for dtype in ("float32", "bfloat16")
]
CASES += [
    pytest.param(size, dtype, "cuda", id=f"cuda-{size}-{dtype}", marks=pytest.mark.gpu)
    for size in ("tiny", "tiny_kv2")
    for dtype in ("float32", "bfloat16")
]


@pytest.fixture(scope="module", autouse=True)
def _engines_closed_after_the_module():
    yield
    close_stacks()


prompt_specs = st.lists(st.tuples(st.integers(24, 1400), st.integers(0, 2)), min_size=1, max_size=3)


@pytest.mark.parametrize("size,dtype,device", CASES)
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@example(widest=1409, others=[(300, 1), (1000, 0)], images=2, order_seed=0)
@example(widest=1025, others=[(64, 0)], images=0, order_seed=1)
@given(
    widest=st.sampled_from(BAD_WIDTHS) | st.integers(32, 2100),
    others=prompt_specs,
    images=st.integers(0, 3),
    order_seed=st.integers(0, 2**16),
)
def test_logprobs_do_not_depend_on_the_batch(size, dtype, device, widest, others, images, order_seed):
    import random

    renderer, engine = stack(size, dtype, device)
    specs = [(widest, images)] + [(min(n, widest), k) for n, k in others]
    prompts = [prompt_of_length(renderer, n, k, seed=i + order_seed) for i, (n, k) in enumerate(specs)]
    shuffled = list(range(len(prompts)))
    random.Random(order_seed).shuffle(shuffled)
    pairs = [[0, j] for j in range(1, len(prompts))]  # the widest prompt next to each other one alone
    report = check_batch_invariance(
        engine, prompts, arrangements=[range(len(prompts)), shuffled, *pairs], dtype=dtype, seed=order_seed
    )
    assert report.n_positions >= 2 * len(prompts) + 2 * len(pairs)  # at least every first token compared
    report.raise_if_failed()
