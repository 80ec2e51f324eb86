"""The engine's sampler draws all rows at once, and picks exactly the tokens one ``torch.multinomial`` per row picked
with the same generators (greedy, plain and truncated rows mixed); a row's token does not depend on its batch; a
non-finite row is an error."""

from __future__ import annotations

import pytest
import torch

from vlrl.engines.sampling import raise_if_unsampled, sample_tokens, sample_tokens_per_row
from vlrl.engines.types import SamplingParams

V = 1000
BANNED = torch.tensor([3, 7, 500])


def batch():
    params = [
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, seed=2),
        SamplingParams(temperature=1.3, seed=3, top_k=20),
        SamplingParams(temperature=1.0, seed=4, top_p=0.9),
        SamplingParams(temperature=0.9, seed=5, min_p=0.05),
        SamplingParams(temperature=1.0, seed=6),
    ]
    logits = torch.randn(len(params), V, generator=torch.Generator().manual_seed(0)) * 3
    return logits, params


def generators(params):
    return [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params]


def test_the_batched_sampler_picks_what_one_multinomial_per_row_picked():
    logits, params = batch()
    gens, ref_gens = generators(params), generators(params)
    for _ in range(50):  # 50 steps: the generators advance alike on both sides
        got = sample_tokens(logits, params, BANNED, gens)
        want = sample_tokens_per_row(logits, params, BANNED, ref_gens)
        assert got.tolist() == want.tolist()
        assert not set(got.tolist()) & set(BANNED.tolist())
        logits = logits.roll(1, dims=-1)


def test_a_rows_token_does_not_depend_on_its_batch():
    logits, params = batch()
    together = sample_tokens(logits, params, BANNED, generators(params)).tolist()
    alone = [sample_tokens(logits[b : b + 1], [p], BANNED, generators([p])).item() for b, p in enumerate(params)]
    assert together == alone


def test_a_non_finite_row_is_an_error_naming_it():
    logits, params = batch()
    logits[2, 10] = float("nan")
    with pytest.raises(RuntimeError, match=r"rows \[2\] are not finite"):
        sample_tokens(logits, params, BANNED, generators(params))


def test_unchecked_a_non_finite_row_is_minus_one_and_named_once_read():
    """The engine samples without waiting for the device (``check=False``) and raises once it reads the tokens."""
    logits, params = batch()
    clean = sample_tokens(logits, params, BANNED, generators(params)).tolist()
    logits[2, 10] = float("nan")
    got = sample_tokens(logits, params, BANNED, generators(params), check=False).tolist()
    assert got[2] == -1 and got[:2] + got[3:] == clean[:2] + clean[3:]
    with pytest.raises(RuntimeError, match=r"rows \[2\] are not finite"):
        raise_if_unsampled(got, range(len(got)))


def test_fp32_out_head_matches_the_upcast_head_and_its_gradients():
    """The half-precision head (:class:`Fp32OutLinear`, as bf16 models run it on CUDA; here its CPU twin): fp32
    logits equal to the upcast product's; gradients = the upstream gradient rounded to bf16 once, exact products,
    and one rounding of the result to bf16 (what a bf16 model's own head back-propagates)."""
    from vlrl.engines.sampling import head_logits

    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 32, generator=g).bfloat16().requires_grad_()
    w = torch.randn(300, 32, generator=g).bfloat16().requires_grad_()
    upstream = torch.randn(12, 300, generator=g)
    logits = head_logits(x, w)
    assert logits.dtype == torch.float32 and logits.grad_fn is not None and "Fp32OutLinear" in logits.grad_fn.name()
    assert torch.equal(logits, torch.nn.functional.linear(x.detach().float(), w.detach().float()))
    (logits * upstream).sum().backward()
    g64 = upstream.bfloat16().double()
    exact = {"x": g64 @ w.detach().double(), "w": g64.T @ x.detach().double()}
    for name, got in (("x", x.grad), ("w", w.grad)):
        assert got is not None and got.dtype == torch.bfloat16
        want = exact[name]
        # one bf16 rounding (unit roundoff 2^-8) of an fp32 sum; fp32's own error is far below it
        assert ((got.double() - want).abs() <= 2**-8 * want.abs() + 1e-5).all(), name
