"""Sampling and the logprob contract (see ``vlrl.engines.types``), as pure torch functions."""

from __future__ import annotations

import importlib.util
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vlrl.engines.types import SamplingParams
from vlrl.models import fused


def effective_temperature(temperature: float) -> float:
    """The T of the logprob contract: the request's temperature, or 1 for greedy."""
    return temperature if temperature > 0 else 1.0


@dataclass(frozen=True)
class CounterDraws:
    """The race drawn by counters (:mod:`vlrl.engines.race_kernel`) instead of generators: per batch row, its request's
    seed (:func:`request_seed`) and how many tokens the request has drawn before this step."""

    seeds: Sequence[int]
    steps: Sequence[int]


def check_race(race: str, device: torch.device) -> None:
    """Refuse a race the engine cannot run, in one line: ``race`` is ``generator`` or ``counter``, and ``counter`` (a
    Triton kernel) needs triton and a CUDA device, or Triton's interpreter (``TRITON_INTERPRET=1``) on a CPU."""
    if race not in ("generator", "counter"):
        raise ValueError(f"race must be 'generator' or 'counter', not {race!r}")
    if race == "counter" and importlib.util.find_spec("triton") is None:
        raise ValueError("race='counter' needs triton (a Triton kernel), which is not installed")
    if race == "counter" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"race='counter' runs on CUDA (or on a CPU under TRITON_INTERPRET=1), not on {device}")


def request_seed(params: SamplingParams) -> int:
    """A request's race seed for :class:`CounterDraws`: its own, or a random one when it asks for none."""
    return params.seed if params.seed is not None else secrets.randbits(63)


def request_generator(params: SamplingParams, device) -> torch.Generator | None:
    """A request's own generator on ``device`` (seeded when it asks for a seed), None for greedy: what makes its
    tokens independent of the batch it decodes in."""
    if params.temperature == 0:
        return None
    gen = torch.Generator(device=device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


HALF = fused.HALF
"""Model dtypes whose LM head runs as one fp32-output GEMM on CUDA (:func:`fp32_head`; a profile may rebind it)."""


def fp32_logits(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head with fp32 logits: ``hidden`` ``[N, H]`` (model dtype) -> logits ``[N, V]`` fp32.

    A bf16 head rounds each logit to 8 bits of mantissa (a logit of 10 carries ±0.03), differently on
    each side once the hidden states differ in their last bits; that matters when logits are peaked.
    Measured on an H100 (benchmarks/results/gpu_correctness_h100/): tiny model after maze SFT, bf16,
    rollout vs trainer max |Δ| 0.039 → 0.0065 and mean 1.1e-3 → 4.5e-4 with fp32 logits; on the
    random-init 2b (near-zero logits) no change (mean 0.0158 both ways). The engine and the trainer both
    call this (the engine through :func:`fp32_head`); a no-op cast for fp32 models.
    """
    return fp32_head(lm_head)(hidden)


def fp32_head(lm_head: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The LM head of :func:`fp32_logits` as a function ``hidden [..., H] -> logits [..., V]`` fp32, for a loop
    over many forwards at fixed weights (the engine's decode steps).

    bf16 / fp16 on CUDA: one GEMM on the tensor cores with fp32 accumulation and fp32 output
    (:class:`Fp32OutLinear`). Products of two bf16 numbers are exact in fp32, so these are the logits of the
    upcast weights up to the order of fp32 additions — while an fp32 GEMM (TF32 off, as vlrl runs) runs on the
    CUDA cores at a tenth of the speed. Elsewhere (CPU, fp32 models) the weight is cast once here (a bf16 2b
    model's head is 0.93 GB in fp32, which a cast per decode step wrote again every step)."""
    weight = lm_head.weight  # an attribute, not get_parameter: wrappers (peft layers) forward it as a property
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"the LM head's weight is a {type(weight).__name__}, not a tensor")
    bias = getattr(lm_head, "bias", None)
    if weight.is_cuda and weight.dtype in HALF:
        return lambda hidden: head_logits(hidden, weight, bias)
    w32, b32 = weight.float(), None if bias is None else bias.float()
    return lambda hidden: torch.nn.functional.linear(hidden.float(), w32, b32)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``hidden [..., H] @ weight[V, H].T (+ bias)`` -> fp32 ``[..., V]``; tensor-core GEMMs when both are the
    same half dtype (:class:`Fp32OutLinear`), else the upcast product."""
    if hidden.dtype != weight.dtype or weight.dtype not in HALF:
        return torch.nn.functional.linear(hidden.float(), weight.float(), None if bias is None else bias.float())
    if hidden.dim() == 2:
        logits = Fp32OutLinear.apply(hidden, weight)
    else:
        flat = hidden.reshape(-1, hidden.shape[-1])
        logits = Fp32OutLinear.apply(flat, weight).reshape(*hidden.shape[:-1], weight.shape[0])
    return logits if bias is None else logits + bias.float()


def mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of two half-precision matrices with fp32 accumulation and an fp32 result: cuBLAS's own
    (``torch.mm`` with ``out_dtype``, CUDA only), else the same products upcast."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


class Fp32OutLinear(torch.autograd.Function):
    """``x [N, H] @ w[V, H].T`` -> fp32 ``[N, V]`` from half-precision ``x`` and ``w`` (:func:`mm32`).

    Backward: the fp32 gradient of the logits is rounded to the half dtype once, then both products
    accumulate in fp32 and are rounded to their input's dtype — the gradients a half-precision model's own
    head would get, without a ``[V, H]`` fp32 copy of the weight or its gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return mm32(x, w.t())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        g = grad.to(w.dtype)
        gx = mm32(g, w).to(x.dtype) if ctx.needs_input_grad[0] else None
        gw = mm32(g.t(), x).to(w.dtype) if ctx.needs_input_grad[1] else None
        return gx, gw


def contract_logprobs(logits: torch.Tensor, temperatures: torch.Tensor | float, banned: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T)`` in fp32 over the vocabulary without ``banned`` (the vision ids,
    which get -inf). logits ``[B, V]`` (model dtype), temperatures ``[B]`` or one float, banned ``[n]``
    -> ``[B, V]``. The engine and the trainer both call this: one definition of the contract."""
    scaled = logits.float().index_fill(1, banned.to(logits.device), float("-inf"))
    if isinstance(temperatures, torch.Tensor):
        return torch.log_softmax(scaled / temperatures.to(logits.device, torch.float32)[:, None], dim=-1)
    return torch.log_softmax(scaled / float(temperatures), dim=-1)


def top_k(contract: torch.Tensor, ks: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per row, the ``ks[b]`` largest entries of ``contract`` ``[B, V]`` (already contract logprobs), on the
    device: ``(values, ids)`` ``[B, max(ks)]`` (one ``topk`` for the batch), or None when no row asks for any."""
    k = max(ks, default=0)
    if k == 0:
        return None
    top = torch.topk(contract, min(k, contract.shape[-1]), dim=-1)
    return top.values, top.indices


def top_pairs(top: tuple[list, list] | None, ks: Sequence[int]) -> list[tuple[tuple[int, float], ...]]:
    """:func:`top_k`'s ``(values, ids)`` as lists -> per row ``ks[b]`` ``(id, logprob)`` pairs, most likely first
    (``()`` where ``ks[b] == 0``)."""
    if top is None:
        return [() for _ in ks]
    vals, ids = top
    return [tuple(zip(ids[b][:kb], vals[b][:kb])) for b, kb in enumerate(ks)]


def truncate(scaled: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Set logits outside the top-k / top-p / min-p set to -inf. ``scaled`` ``[V]`` (already ÷ T)."""
    out = scaled
    if top_k and top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # keep a token if the mass before it is < top_p (so the first token is always kept)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    if min_p > 0.0:
        probs = torch.softmax(out, dim=-1)
        out = out.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return out


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    banned: torch.Tensor,
    draws: Sequence[torch.Generator | None] | CounterDraws,
    check: bool = True,
) -> torch.Tensor:
    """Pick one token per row. logits ``[B, V]`` raw fp32; ``banned`` ``[n]`` ids never to be picked.

    Returns ``[B]`` int64. A sampled row whose logits are not finite (NaN, or all -inf) raises here with ``check``;
    without it the row's token is -1 and the caller raises (:func:`raise_if_unsampled`) once it reads the tokens, so
    nothing here waits for the device. Greedy rows take the argmax of the banned-masked logits; sampled rows draw from
    softmax(truncate(masked / T)) with their own generator in ``draws`` (reproducible per request), as
    ``torch.multinomial(probs, 1, generator=g)`` draws: argmax(probs / q), q ~ Exp(1) from ``g`` over the row. The
    rows are drawn together — one exponential fill per row, the rest batched (on a CPU in blocks of :data:`CPU_ROWS`)
    — where one multinomial per row cost a host sync and ~6 kernels a row each step (16,384 of them for 256 requests
    of 64 tokens). The tokens are the same either way (``tests/foundation/test_sampling.py``; on CUDA
    ``benchmarks/sampler_speed.py``). With :class:`CounterDraws` for ``draws`` the whole race is one kernel
    (:mod:`vlrl.engines.race_kernel`).
    """
    masked = logits.float().index_fill(1, banned.to(logits.device), float("-inf"))
    rows = [b for b, p in enumerate(params) if p.temperature != 0]
    if not rows:
        return masked.argmax(dim=-1)
    every = len(rows) == len(params)
    index = None if every else torch.tensor(rows, device=logits.device)
    # in place on ``masked`` only when no row is greedy (its argmax is needed no more)
    scaled = masked if index is None else masked[index]
    temps = [params[b].temperature for b in rows]
    if len(set(temps)) == 1:  # one temperature (the usual batch): no tensor to copy to the device
        scaled.div_(temps[0])
    else:
        scaled.div_(torch.tensor(temps, dtype=torch.float32, device=logits.device)[:, None])
    for j, b in enumerate(rows):
        p = params[b]
        if p.top_k or p.top_p < 1.0 or p.min_p > 0.0:
            scaled[j] = truncate(scaled[j], p.top_k, p.top_p, p.min_p)
    top = scaled.amax(dim=-1)  # NaN or all -inf: a broken forward (or all banned) is an error, not a token
    if check and not bool(torch.isfinite(top).all()):
        raise_if_unsampled([-1 if bad else 0 for bad in (~torch.isfinite(top)).tolist()], rows)
    if isinstance(draws, CounterDraws):
        picks = [counter_race(scaled, [draws.seeds[b] for b in rows], [draws.steps[b] for b in rows])]
    else:
        picks = []
        block = len(rows) if scaled.is_cuda else CPU_ROWS
        for lo in range(0, len(rows), block):
            probs = torch.softmax(scaled[lo : lo + block], dim=-1)
            race = torch.empty_like(probs)
            for j, row in enumerate(race.unbind(0)):  # one call for the row views, not one per row
                row.exponential_(1.0, generator=draws[rows[lo + j]])
            picks.append(torch.div(probs, race, out=race).argmax(dim=-1))
    picked = torch.where(torch.isfinite(top), torch.cat(picks), -1)
    return picked if index is None else masked.argmax(dim=-1).index_copy(0, index, picked)


def counter_race(scaled: torch.Tensor, seeds: Sequence[int], steps: Sequence[int]) -> torch.Tensor:
    """:func:`vlrl.engines.race_kernel.race_argmax` of ``scaled`` ``[n, V]`` with the rows' seeds and draw numbers
    (moved to the device by one :func:`on_device` copy)."""
    from vlrl.engines.race_kernel import race_argmax  # Triton: imported where the race runs

    keys = on_device([*seeds, *steps], scaled.device)
    return race_argmax(scaled, keys[: len(seeds)], keys[len(seeds) :])


def on_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``; on CUDA copied from pinned memory, so the host does not wait for
    the work already queued there (a pageable copy would: the pipelined decode's next forward)."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def raise_if_unsampled(tokens: Sequence[int], rows: Sequence[int]) -> None:
    """Raise for the rows :func:`sample_tokens` could not sample (token -1), naming them as ``rows`` does."""
    bad = [rows[j] for j, t in enumerate(tokens) if t < 0]
    if bad:
        raise RuntimeError(f"sampling: the logits of batch rows {bad} are not finite")


def sample_tokens_per_row(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    banned: torch.Tensor,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """:func:`sample_tokens` one row at a time through ``torch.multinomial`` (the engine's sampler before
    2026-11-26): the reference it must pick the same tokens as, in tests and ``benchmarks/sampler_speed.py``."""
    masked = logits.float().index_fill(1, banned.to(logits.device), float("-inf"))
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for b, p in enumerate(params):
        if p.temperature == 0:
            out[b] = torch.argmax(masked[b])
            continue
        row = truncate(masked[b] / p.temperature, p.top_k, p.top_p, p.min_p)
        out[b] = torch.multinomial(torch.softmax(row, dim=-1), 1, generator=generators[b])[0]
    return out


CPU_ROWS = 4
"""Rows a CPU draws at a time: 4 × 151,936 fp32 probabilities stay in cache, a whole batch's do not (64 rows at
once made the step 12 % slower than one row at a time on 2 cores; the GPU draws all rows at once)."""
