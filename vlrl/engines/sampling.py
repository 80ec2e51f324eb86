"""Sampling and the logprob contract (see ``vlrl.engines.types``), as pure torch functions.

Sampling is batched: a constant number of tensor ops per decode step, whatever the batch size. A Python loop
over the rows (softmax, ``multinomial`` with the request's own ``torch.Generator``, an assignment) made 1,796
top-level aten calls per step at 256 rows (torch.profiler, CPU), and the decode step host-bound on an H100;
``sample_tokens`` makes 50 at any batch size.
Randomness is counter-based: row ``b``'s uniform at step ``t`` is a splitmix64 hash of (its request's key, t),
so a request's tokens depend only on its seed and its logits, never on its batch or row position.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vlrl.engines.types import SamplingParams


def effective_temperature(temperature: float) -> float:
    """The T of the logprob contract: the request's temperature, or 1 for greedy."""
    return temperature if temperature > 0 else 1.0


def fp32_logits(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head in fp32: ``hidden`` ``[N, H]`` (model dtype) -> logits ``[N, V]`` fp32.

    A bf16 head rounds each logit to 8 bits of mantissa (a logit of 10 carries ±0.03), differently on
    each side once the hidden states differ in their last bits; that matters when logits are peaked.
    Measured on an H100 (benchmarks/results/gpu_correctness_h100/): tiny model after maze SFT, bf16,
    rollout vs trainer max |Δ| 0.039 → 0.0065 and mean 1.1e-3 → 4.5e-4 with the head in fp32; on the
    random-init 2b (near-zero logits) no change (mean 0.0158 both ways). The engine and the trainer both
    call this; a no-op cast for fp32 models.
    """
    weight = lm_head.weight  # an attribute, not get_parameter: wrappers (peft layers) forward it as a property
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"the LM head's weight is a {type(weight).__name__}, not a tensor")
    bias = getattr(lm_head, "bias", None)
    return torch.nn.functional.linear(hidden.float(), weight.float(), None if bias is None else bias.float())


def contract_logprobs(logits: torch.Tensor, temperatures: torch.Tensor | float, banned: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T)`` in fp32 over the vocabulary without ``banned`` (the vision ids,
    which get -inf). logits ``[B, V]`` (model dtype), temperatures ``[B]`` or one float, banned ``[n]``
    -> ``[B, V]``. The engine and the trainer both call this: one definition of the contract."""
    scaled = logits.float().index_fill(1, banned.to(logits.device), float("-inf"))
    if isinstance(temperatures, torch.Tensor):
        return torch.log_softmax(scaled / temperatures.to(logits.device, torch.float32)[:, None], dim=-1)
    return torch.log_softmax(scaled / float(temperatures), dim=-1)


def top_logprobs(contract: torch.Tensor, ks: Sequence[int]) -> list[tuple[tuple[int, float], ...]]:
    """Per row, the ``ks[b]`` largest entries of ``contract`` ``[B, V]`` (already contract logprobs)
    as ``(id, logprob)`` pairs, most likely first; ``()`` where ``ks[b] == 0``. One ``topk`` for the batch."""
    k = max(ks, default=0)
    if k == 0:
        return [() for _ in ks]
    top = torch.topk(contract, min(k, contract.shape[-1]), dim=-1)
    vals, ids = top.values.tolist(), top.indices.tolist()
    return [tuple(zip(ids[b][:kb], vals[b][:kb])) for b, kb in enumerate(ks)]


# splitmix64 (Steele, Lea, Flood 2014) constants as signed int64: torch has no uint64 arithmetic.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)


def _int64(x: int) -> int:
    """A Python int reduced mod 2**64 into int64's range (seeds may be any int; torch wraps the same way)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 ``x`` by ``s``: torch's ``>>`` is arithmetic (copies the sign bit)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 ``x`` (any shape), elementwise: a bijection of 64-bit words whose output
    bits each depend on every input bit. int64 multiply and add wrap mod 2**64 (two's complement) on CPU and
    CUDA, which is the unsigned arithmetic splitmix64 is defined with."""
    x = (x ^ _shr(x, 30)) * _MUL1
    x = (x ^ _shr(x, 27)) * _MUL2
    return x ^ _shr(x, 31)


def request_key(params: SamplingParams) -> int:
    """The int64 key of a request's random stream: its seed, or fresh OS entropy when it has none (drawn once
    per request, so its tokens still follow one stream). Not torch's global RNG: the engine's worker thread
    drawing from it would shift the stream of whatever else runs in the process (a trainer's dropout)."""
    return _int64(params.seed if params.seed is not None else secrets.randbits(64))


def uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """Row uniforms in (0, 1) for decode step ``step``: keys ``[B]`` int64 (``request_key``) -> ``[B]`` float64.

    splitmix64: the stream of a key is ``mix64(mix64(key) + (step + 1) * golden)``; the top 53 bits make the
    float, +0.5 keeps it off 0 (a target of 0 would select a leading zero-probability id)."""
    state = mix64(keys) + _int64((step + 1) * _GOLDEN)
    return (_shr(mix64(state), 11).double() + 0.5) * 2.0**-53


@dataclass(frozen=True)
class RowSampling:
    """A decode batch's per-row settings, as device tensors built once per batch (``[B]`` each): ``keys``
    int64 stream keys, ``temperature`` fp32 (1 for greedy rows), ``greedy`` bool, ``top_k`` int64 (0 = off),
    ``top_p`` / ``min_p`` fp32. ``params`` keeps the host copy, to branch without reading the device."""

    params: tuple[SamplingParams, ...]
    keys: torch.Tensor
    temperature: torch.Tensor
    greedy: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def build(cls, params: Sequence[SamplingParams], keys: Sequence[int], device) -> RowSampling:
        def t(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(device)

        return cls(
            params=tuple(params),
            keys=t([_int64(k) for k in keys], torch.int64),
            temperature=t([effective_temperature(p.temperature) for p in params], torch.float32),
            greedy=t([p.temperature == 0 for p in params], torch.bool),
            top_k=t([p.top_k for p in params], torch.int64),
            top_p=t([p.top_p for p in params], torch.float32),
            min_p=t([p.min_p for p in params], torch.float32),
        )

    def select(self, keep: Sequence[int], index: torch.Tensor) -> RowSampling:
        """The rows ``keep`` (host list) = ``index`` (``[K]`` on the device), in that order."""
        return RowSampling(
            params=tuple(self.params[k] for k in keep),
            keys=self.keys[index],
            temperature=self.temperature[index],
            greedy=self.greedy[index],
            top_k=self.top_k[index],
            top_p=self.top_p[index],
            min_p=self.min_p[index],
        )


def _truncates(p: SamplingParams) -> bool:
    return p.temperature > 0 and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0)


def truncate_sorted(scaled: torch.Tensor, rows: RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-k / top-p / min-p set, in descending order: scaled ``[R, V]`` (already ÷ T) with ``rows``
    of ``R`` rows -> (sorted logits ``[R, V]`` with the dropped ones -inf, their ids ``[R, V]`` int64).

    The rule of the former one-row ``truncate``: top-k keeps ids at or above the k-th logit (ties stay), top-p
    then keeps an id while the mass before it is < top_p (the first always), min-p then drops ids below min_p ×
    the largest probability. Sorted by a stable sort, so tied ids keep their id order whatever the batch. Which
    steps run is decided from the host copy of the settings: no branch waits for the device."""
    out, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    vocab, params = scaled.shape[-1], rows.params
    if any(p.top_k > 0 for p in params):
        k = torch.where((rows.top_k > 0) & (rows.top_k < vocab), rows.top_k, vocab)  # off (or past V): keep all
        kth = out.gather(1, k[:, None] - 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        probs = torch.softmax(out, dim=-1)
        # rows at top_p = 1 keep all: their cumulative sum can round above 1, which would drop their tail
        drop = ((probs.cumsum(-1) - probs) >= rows.top_p[:, None]) & (rows.top_p < 1.0)[:, None]
        out = out.masked_fill(drop, float("-inf"))
    if any(p.min_p > 0.0 for p in params):
        probs = torch.softmax(out, dim=-1)
        out = out.masked_fill(probs < rows.min_p[:, None] * probs[:, :1], float("-inf"))  # [:, :1]: the max
    return out, order


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the first column whose cumulative weight reaches ``u`` × the row's total: weights ``[R, V]``
    (unnormalised, >= 0), u ``[R]`` in (0, 1) -> (columns ``[R]`` int64, ``[R]`` bool: the column's weight > 0).

    The sum is in fp64: in fp32 the running total over ~151k ids rounds away ids below ~1e-7 of it. A parallel
    scan may round a zero-weight column's entry a last bit above its predecessor's, so that such a column
    (banned or truncated) is hit with probability ~1e-16: the flag lets the caller replace it."""
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    col = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp_(max=cdf.shape[-1] - 1)
    return col[:, 0], weights.gather(1, col)[:, 0] > 0


def sample_tokens(logits: torch.Tensor, rows: RowSampling, banned: torch.Tensor, step: int) -> torch.Tensor:
    """Pick one token per row at decode step ``step``. logits ``[B, V]`` raw fp32; ``banned`` ``[n]`` ids never
    to be picked. Returns ``[B]`` int64; a constant number of ops whatever ``B``.

    Greedy rows take the argmax of the banned-masked logits. Sampled rows draw from
    softmax(truncate(masked / T)) by inverse CDF with their own uniform (``uniforms``): one random number per
    row, not one per id (a per-id hash costs ~15 int64 ops over ``[B, V]``: 2.2 s a step for 256 rows on one CPU
    core). Rows without truncation walk the vocabulary in id order (no sort); rows with it walk their kept set in
    descending order (top-p sorts anyway), gathered into one batch, so that an id at the set's boundary moves
    the other draws only through the total. Either way the draw, unlike an exponential race, depends on the
    cumulative mass before it: on a near-flat distribution (a random-init model) a 1e-7 change of the logits
    that lets a boundary id in or out changes it often. Equal logits always give equal draws.
    """
    masked = logits.float().index_fill(1, banned.to(logits.device), float("-inf"))
    best = torch.argmax(masked, dim=-1)  # [B]: greedy rows' token; also kept by every truncation (fallback)
    if all(p.temperature == 0 for p in rows.params):
        return best
    scaled, u = masked / rows.temperature[:, None], uniforms(rows.keys, step)
    cut = [b for b, p in enumerate(rows.params) if _truncates(p)]  # host-side bookkeeping, no device work
    if len(cut) < len(rows.params):
        drawn, ok = _inverse_cdf(torch.exp(scaled - scaled.amax(dim=-1, keepdim=True)), u)
    if cut:
        index = torch.tensor(cut, device=logits.device)
        sub = rows if len(cut) == len(rows.params) else rows.select(cut, index)
        ordered, ids = truncate_sorted(scaled.index_select(0, index) if sub is not rows else scaled, sub)
        rank, sub_ok = _inverse_cdf(torch.exp(ordered - ordered[:, :1]), u[index])
        sub_drawn = ids.gather(1, rank[:, None])[:, 0]
        if sub is rows:
            drawn, ok = sub_drawn, sub_ok
        else:
            drawn, ok = drawn.index_copy(0, index, sub_drawn), ok.index_copy(0, index, sub_ok)
    return torch.where(rows.greedy | ~ok, best, drawn)
