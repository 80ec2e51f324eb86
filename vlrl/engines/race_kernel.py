"""The sampler's exponential race for a whole batch in one Triton kernel (opt-in: ``EmbeddedEngine(race="counter")``).

``vlrl.engines.sampling.sample_tokens`` picks a sampled row's token as ``argmax(p / E)`` with ``E ~ Exp(1)`` per
vocabulary entry (``torch.multinomial``'s draw), ``E`` from the request's own ``torch.Generator``: one
``exponential_`` call per row per step, which at 256 requests of 64 tokens was 16,384 calls and ~150 ms of host time
on the H200 (benchmarks/results/engine_profile/h200_0a0a2ed_256x64.json). Here every row is one program of one
kernel: ``E = -log(U)`` with ``U`` from Philox keyed by the request's seed at the counter (vocabulary index, the
request's draw number), so a request's draws depend on nothing but its seed and how many tokens it has drawn —
independent of the batch by construction — and the token is ``argmax(scaled - log(E))`` (the same argmax as
``p / E``: ``log p`` is ``scaled`` less the row's logsumexp), with no softmax and no ``[B, V]`` noise in memory.

The tokens differ from the generator path's for the same seed (another random stream), not in distribution
(``tests/foundation/test_race_kernel.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048
"""Vocabulary entries a program reads at a time (the Qwen vocabulary, 151,936, in 75 blocks)."""


@triton.jit
def _race(scaled_ptr, row_stride, seeds_ptr, steps_ptr, out_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seeds_ptr + row)  # int64: Philox's key
    step = tl.load(steps_ptr + row).to(tl.uint32)  # the request's draw number: Philox's second counter word
    best = -float("inf")
    best_i = 0
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(scaled_ptr + row.to(tl.int64) * row_stride + cols, mask=cols < V, other=-float("inf"))
        word = cols.to(tl.uint32)
        zero = word * 0
        bits, _, _, _ = tl.philox(seed, word, zero + step, zero, zero)
        u = tl.uint_to_uniform_float(bits)  # [0, 1); 0 gives E = inf: that entry cannot win
        # E >= 1e-30 as torch's exponential_ clamps: near u = 1, E is ~6e-8, and a log rounded to 0 would make it win
        score = x - tl.log(tl.maximum(-tl.log(u), 1e-30))
        m = tl.max(score, axis=0)
        i = tl.argmax(score, axis=0)
        take = m > best  # a tie keeps the earlier block: the first index, as torch.argmax
        best_i = tl.where(take, start + i, best_i)
        best = tl.where(take, m, best)
    tl.store(out_ptr + row, best_i)


def race_argmax(scaled: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Per row ``argmax(scaled - log(E))``, ``E ~ Exp(1)`` by Philox at (seed, vocabulary index, step).

    scaled ``[B, V]`` fp32 (logits ÷ T, truncated entries -inf), seeds ``[B]`` int64, steps ``[B]`` int64, on one
    device -> ``[B]`` int64. A row of -inf (or NaN) gives 0: the caller checks its rows' logits are finite."""
    scaled = scaled.contiguous()
    out = torch.empty(scaled.shape[0], dtype=torch.int32, device=scaled.device)
    if scaled.shape[0]:
        _race[(scaled.shape[0],)](scaled, scaled.stride(0), seeds, steps, out, scaled.shape[1], BLOCK=BLOCK)
    return out.long()
