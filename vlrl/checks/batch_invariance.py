"""Batch invariance: a prompt's logprobs must not depend on which other prompts share its batch.

An engine batches whatever is queued, so one trajectory's turns are prefilled and decoded next to
different neighbours every time: different batch widths, padding and images. If a kernel's result
depends on that shape (the SDPA stride-0 bug in ``vlrl.models.attention`` did, at widths ≡ 1 mod 64),
rollout logprobs disagree with the trainer only for some batches — "not reproducible". This check
makes the dependence itself the failure: every prompt is generated alone, then inside each given
arrangement (one batch per arrangement, any order), with the same per-request seed, and their
logprobs are compared.

Compared per generated position while both runs have produced the same tokens so far (same context):
the sampled token's logprob when both sampled it, and the logprobs of every id in both top-k lists.
A position where one run's most likely id is missing from the other's top-k counts as ``inf``, so a
grossly wrong distribution cannot hide behind a sample that happened to differ. The first position
(predicted by the prefill) is always compared. The bound is per dtype (``vlrl.checks.bounds``).

Works with any engine whose ``generate(prompts, params)`` decodes its prompts together (the embedded
engine guarantees one batch per call; vLLM batches what it is given as its scheduler decides).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlrl.checks.bounds import bounds_for
from vlrl.engines.types import Engine, Generation, SamplingParams

if TYPE_CHECKING:
    from vlrl.render.types import RenderedPrompt


class BatchVarianceError(AssertionError):
    """A prompt's logprobs changed with its batch beyond the bound; ``report`` holds the details."""

    def __init__(self, message: str, report: BatchInvarianceReport):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Difference:
    """One compared position: prompt ``prompt`` at generated position ``position`` inside ``batch``."""

    prompt: int
    prompt_len: int
    batch: tuple[int, ...]
    batch_width: int
    position: int
    delta: float
    """Largest |Δ logprob| over the compared ids (inf: a top-1 id missing from the other top-k)."""

    def describe(self) -> str:
        return (
            f"prompt {self.prompt} ({self.prompt_len} tokens) in batch {list(self.batch)} (width "
            f"{self.batch_width}), generated position {self.position}: |Δ| {self.delta:.3g} vs alone"
        )


@dataclass(frozen=True)
class BatchInvarianceReport:
    n_prompts: int
    n_batches: int
    n_positions: int
    max_abs: float
    mean_abs: float
    first_token_max_abs: float
    """Largest |Δ| at generated position 0 (the prefill's last row)."""
    bound: float
    worst: tuple[Difference, ...]
    """The largest differences first."""

    @property
    def passed(self) -> bool:
        return self.n_positions > 0 and self.max_abs <= self.bound

    def summary(self) -> str:
        head = (
            f"{self.n_prompts} prompts in {self.n_batches} batches, {self.n_positions} positions: max |Δ| "
            f"{self.max_abs:.3g} (bound {self.bound:g}), mean {self.mean_abs:.3g}, first token max "
            f"{self.first_token_max_abs:.3g}"
        )
        return head + (f"; worst: {self.worst[0].describe()}" if self.worst else "")

    def row(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "worst"}
        return out | {"passed": self.passed, "worst": [vars(w) for w in self.worst]}

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise BatchVarianceError(f"logprobs depend on the batch: {self.summary()}", self)


def check_batch_invariance(
    engine: Engine,
    prompts: Sequence[RenderedPrompt],
    *,
    arrangements: Sequence[Sequence[int]] | None = None,
    dtype: Any = "float32",
    bound: float | None = None,
    max_tokens: int = 4,
    topk: int = 5,
    seed: int = 0,
    temperature: float = 1.0,
    n_worst: int = 5,
) -> BatchInvarianceReport:
    """Generate each prompt alone, then each arrangement (indices into ``prompts``) as one batch;
    compare (see the module docstring). Default arrangements: all prompts in order, then reversed."""
    if not prompts:
        raise ValueError("check_batch_invariance needs at least one prompt")
    params = [
        SamplingParams(
            temperature=temperature, max_tokens=max_tokens, seed=seed + i, ignore_eos=True, logprobs_topk=topk
        )
        for i in range(len(prompts))
    ]
    n = len(prompts)
    orders = [list(a) for a in arrangements] if arrangements else [list(range(n)), list(reversed(range(n)))]
    alone = [_cold(engine, [p], [sp])[0] for p, sp in zip(prompts, params)]
    diffs: list[Difference] = []
    for arr in orders:
        batched = _cold(engine, [prompts[i] for i in arr], [params[i] for i in arr])
        width = max(len(prompts[i]) for i in arr)
        for i, gen in zip(arr, batched):
            diffs += [Difference(i, len(prompts[i]), tuple(arr), width, k, d) for k, d in _compare(alone[i], gen)]
    deltas = [d.delta for d in diffs]
    finite = [d for d in deltas if math.isfinite(d)]
    first = [d.delta for d in diffs if d.position == 0]
    return BatchInvarianceReport(
        n_prompts=len(prompts),
        n_batches=len(orders),
        n_positions=len(diffs),
        max_abs=max(deltas, default=0.0),
        mean_abs=sum(finite) / len(finite) if finite else math.inf,
        first_token_max_abs=max(first, default=0.0),
        bound=bounds_for(dtype).batch_invariance if bound is None else bound,
        worst=tuple(sorted(diffs, key=lambda d: -d.delta)[:n_worst]),
    )


def _cold(engine: Engine, prompts: list[RenderedPrompt], params: list[SamplingParams]) -> list[Generation]:
    """``engine.generate`` from empty caches: with the prefix keys / values of the alone run cached, a batched
    run would only compute the last prompt token and compare the alone run's attention with itself (the
    embedded engine's prefix reuse hid the H100 kernel bug from this check that way; vLLM caches prefixes too)."""
    engine.clear_caches()
    return engine.generate(prompts, params)


def _compare(a: Generation, b: Generation) -> list[tuple[int, float]]:
    """``(position, |Δ|)`` for each position of ``a`` and ``b`` reached with the same context."""
    out = []
    for k in range(min(len(a.token_ids), len(b.token_ids))):
        ta, tb = dict(a.top_logprobs[k]), dict(b.top_logprobs[k])
        deltas = [abs(ta[i] - tb[i]) for i in ta.keys() & tb.keys()]
        if a.token_ids[k] == b.token_ids[k]:
            deltas.append(abs(a.logprobs[k] - b.logprobs[k]))
        top_a, top_b = a.top_logprobs[k][0][0], b.top_logprobs[k][0][0]
        if top_a not in tb or top_b not in ta:
            deltas.append(math.inf)
        out.append((k, max(deltas)))
        if a.token_ids[k] != b.token_ids[k]:
            break  # the contexts differ from here on
    return out
