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


def test_row_noise_gives_a_request_its_own_draws_whatever_its_batch():
    """``RowNoise`` (the engine's draws on CUDA, ``DRAW`` steps at a time): a request's draws at each step are the
    same alone, in a batch, and after the rows beside it left, across refills."""
    from vlrl.engines.sampling import DRAW, RowNoise

    steps = 2 * DRAW + 1

    def gens(seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    alone = RowNoise(gens([7]), V, "cpu")
    want = [alone.take([0]).clone() for _ in range(steps)]
    batch = RowNoise(gens([5, 7, 9]), V, "cpu")
    for step in range(steps):
        rows = [0, 1, 2] if step < DRAW + 1 else [1]  # the others finish mid-way through a refill's draws
        got = batch.take(rows)
        assert torch.equal(got[rows.index(1)], want[step][0]), step
    assert not torch.equal(want[0], want[1]) and bool((torch.stack(want) > 0).all())


def test_sampling_with_row_noise_keeps_each_requests_tokens_and_the_softmax_frequencies():
    from vlrl.engines.sampling import RowNoise

    logits, params = batch()

    def run(rows):
        ps = [params[b] for b in rows]
        noise = RowNoise(generators(ps), V, "cpu")
        return [
            sample_tokens(logits[rows], ps, BANNED, [None] * len(ps), noise=noise.of(range(len(ps)))) for _ in range(9)
        ]

    together = torch.stack(run(list(range(len(params)))))
    for b in range(len(params)):
        assert torch.stack(run([b]))[:, 0].tolist() == together[:, b].tolist(), b
    # the draws are Exp(1): argmax(p / q) picks token i with probability p_i (4 tokens, 4,000 draws)
    small = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    noise = RowNoise([torch.Generator().manual_seed(3)], 4, "cpu")
    picks = torch.stack(
        [
            sample_tokens(
                small, [SamplingParams(seed=3)], torch.tensor([], dtype=torch.long), [None], noise=noise.of([0])
            )
            for _ in range(4000)
        ]
    )
    freq = torch.bincount(picks.flatten(), minlength=4).float() / 4000
    assert (freq - torch.softmax(small[0], -1)).abs().max() < 0.03, freq
