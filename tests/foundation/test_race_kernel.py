"""The race by counters (``vlrl.engines.race_kernel``, ``EmbeddedEngine(race="counter")``): a request's draw depends on
its seed and draw number only, tokens come at softmax frequencies, truncated entries are never drawn, greedy rows
keep their argmax, and the engine keeps a request's tokens whatever its batch.

On CUDA under ``-m gpu``; on a CPU through Triton's interpreter where triton is installed (it is not in CI's CPU
environment: there these skip, and the GPU suite runs them)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from vlrl.engines.types import SamplingParams

DEVICES = [pytest.param("cpu", id="cpu-interpreter"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def race_argmax(device):
    if device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("triton was imported without its interpreter in this process (its own kernels are compiled)")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
    pytest.importorskip("triton")
    from vlrl.engines.race_kernel import race_argmax

    return race_argmax


def keys(seeds, steps, device):
    return torch.tensor(seeds, device=device), torch.tensor(steps, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_a_rows_draw_depends_on_its_seed_and_draw_number_only(race_argmax, device):
    torch.manual_seed(0)
    scaled = (torch.randn(6, 5000) * 2).to(device)
    seeds, steps = [11, 12, 11, 2**62 + 3, 5, 5], [0, 0, 7, 3, 1, 2]
    batch = race_argmax(scaled, *keys(seeds, steps, device)).tolist()
    alone = [race_argmax(scaled[b : b + 1], *keys([seeds[b]], [steps[b]], device)).item() for b in range(6)]
    order = [3, 0, 5, 1, 4, 2]
    shuffled = race_argmax(scaled[order], *keys([seeds[b] for b in order], [steps[b] for b in order], device))
    assert batch == alone == [dict(zip(order, shuffled.tolist()))[b] for b in range(6)]
    later = race_argmax(scaled, *keys(seeds, [s + 1 for s in steps], device)).tolist()
    assert later != batch, "the next draw of every request gave the same tokens"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("at", [0, 2047, 2048, 4100, 4999])
def test_the_argmax_is_found_in_any_block_of_the_vocabulary(race_argmax, device, at):
    """One finite entry: it is the token, whichever block of the kernel's loop holds it (blocks of 2,048)."""
    scaled = torch.full((2, 5000), float("-inf"))
    scaled[:, at] = 0.0
    scaled[1, (at + 1) % 5000] = -0.5  # a second candidate: still one of the two, never an entry outside the set
    picks = race_argmax(scaled.to(device), *keys([3, 4], [0, 0], device)).tolist()
    assert picks[0] == at and picks[1] in (at, (at + 1) % 5000)


@pytest.mark.gpu
def test_a_peaked_distribution_over_the_whole_vocabulary_picks_its_peak():
    """At the Qwen vocabulary (151,936) with one logit 0 and the rest -30, the rest carry 1.4e-8 of the mass: an
    error in the noise near U = 1 (E rounded to 0) would let an arbitrary token win about once a row."""
    pytest.importorskip("triton")
    from vlrl.engines.race_kernel import race_argmax

    n, vocab = 20_000, 151_936
    scaled = torch.full((1, vocab), -30.0, device="cuda").expand(n, vocab).contiguous()
    scaled[:, 77_777] = 0.0
    picks = race_argmax(scaled, torch.full((n,), 9, device="cuda"), torch.arange(n, device="cuda"))
    assert int((picks != 77_777).sum()) <= 2


@pytest.mark.parametrize("device", DEVICES)
def test_tokens_come_at_softmax_frequencies_and_never_from_outside_the_set(race_argmax, device):
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5, float("-inf"), 1.5])
    n = 4000  # one request's 4,000 draws, as one batch of rows (seed 7, draw numbers 0..3999)
    picks = race_argmax(logits.repeat(n, 1).to(device), *keys([7] * n, list(range(n)), device)).cpu()
    freq = torch.bincount(picks, minlength=7).double() / n
    assert freq[5] == 0
    np.testing.assert_allclose(freq.numpy(), torch.softmax(logits.double(), -1).numpy(), atol=0.025)


@pytest.mark.parametrize("device", DEVICES)
def test_sample_tokens_with_counters_keeps_greedy_rows_and_names_a_broken_row(race_argmax, device):
    from vlrl.engines.sampling import CounterDraws, sample_tokens

    torch.manual_seed(1)
    logits = torch.randn(3, 300).to(device)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3), SamplingParams(top_k=1)]
    banned = torch.tensor([int(logits[0].argmax())])  # the greedy row's favourite is banned: its second best wins
    tokens = sample_tokens(logits, params, banned, CounterDraws([0, 3, 9], [0, 0, 0])).tolist()
    masked = logits.clone()
    masked[:, banned] = float("-inf")
    assert tokens[0] == int(masked[0].argmax()) and tokens[2] == int(masked[2].argmax())  # top-k 1 is greedy too
    assert tokens[1] not in banned.tolist()
    broken = logits.clone()
    broken[1] = float("nan")
    with pytest.raises(RuntimeError, match=r"batch rows \[1\]"):
        sample_tokens(broken, params, banned, CounterDraws([0, 3, 9], [0, 0, 0]))


@pytest.mark.parametrize("device", DEVICES)
def test_the_engine_keeps_a_requests_tokens_whatever_its_batch(race_argmax, device, tiny):
    from vlrl.engines.embedded import EmbeddedEngine

    from .test_engine import prompts

    b = tiny("qwen2_5_vl")
    engine = EmbeddedEngine.from_pretrained(b.path, device=device, race="counter")
    ps = prompts(b.renderer)
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=123, ignore_eos=True)
    alone = engine.generate([ps["single"]], params)[0]
    together = engine.generate(
        [ps["multi"], ps["single"], ps["multi"]],
        [SamplingParams(seed=5, max_tokens=4), params, SamplingParams(seed=6, max_tokens=14)],
    )
    assert together[1].token_ids == alone.token_ids
    np.testing.assert_allclose(together[1].logprobs, alone.logprobs, atol=1e-5)
    other = engine.generate([ps["single"]], SamplingParams(temperature=1.0, max_tokens=12, seed=124, ignore_eos=True))
    assert other[0].token_ids != alone.token_ids


def test_an_engine_refuses_a_race_it_cannot_run(tiny):
    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_5_vl")
    with pytest.raises(ValueError, match="race must be 'generator' or 'counter', not 'philox'"):
        EmbeddedEngine(b.model, b.tokenizer, race="philox")  # type: ignore[arg-type]
