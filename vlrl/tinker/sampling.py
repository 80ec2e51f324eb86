"""Saved sampler weights and the one engine that samples from them.

``save_weights_for_sampler`` files a copy of a trained model's weights (LoRA merged in) under a
``tinker://`` path; a sampling session names a path (or the base model). The engine holds one set
of weights at a time: a request for other weights waits until the requests in flight on the
current set have finished, then the engine's weights are swapped in place
(``Engine.update_weights``). Requests on the same weights run concurrently, so the engine batches
them (the embedded engine decodes whatever is queued as one batch).

Sampling follows the engine logprob contract (``vlrl.engines.types``): the logprob of each sampled
token is ``log_softmax(logits / T)`` over the vocabulary without the vision ids, before top-k / top-p;
``temperature = 0`` is greedy (logprobs at ``T = 1``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vlrl.engines.types import Engine, SamplingParams
from vlrl.errors import BadInputError
from vlrl.tinker.wire import SampledSequence

if TYPE_CHECKING:
    import torch

    from vlrl.render.types import RenderedPrompt

BASE = "base"
"""The key of the served checkpoint's own weights."""


@dataclass(frozen=True)
class SampleSpec:
    """A ``sample`` request's parameters, validated (the SDK's ``SamplingParams`` + ``num_samples``)."""

    num_samples: int
    max_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()

    def params(self, i: int) -> SamplingParams:
        """The engine parameters of sample ``i`` (seeds differ per sample so that samples differ)."""
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            stop=self.stop_strings,
            stop_token_ids=self.stop_tokens,
            seed=None if self.seed is None else self.seed + i,
        )


def sample_spec(body: dict, *, max_samples: int, default_max_tokens: int) -> SampleSpec:
    """:class:`SampleSpec` of a JSON ``sample`` body; unsupported options are refused by name."""
    for key in ("prompt_logprobs", "record_stability_info"):
        if body.get(key):
            raise BadInputError(f"{key} is not supported by this server (use forward for prompt logprobs)")
    for key in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        if body.get(key):
            raise BadInputError(f"{key} is not supported by this server")
    if body.get("target_prompt_logprobs") is not None or body.get("prompt_logprobs_last_n") is not None:
        raise BadInputError("target_prompt_logprobs / prompt_logprobs_last_n are not supported by this server")
    n = int(body.get("num_samples", 1))
    if not 1 <= n <= max_samples:
        raise BadInputError(f"num_samples must be in 1..{max_samples}, got {n}")
    sp = body.get("sampling_params") or {}
    stop = sp.get("stop")
    stop = [stop] if isinstance(stop, str) else list(stop or ())
    strings = tuple(s for s in stop if isinstance(s, str))
    tokens = tuple(int(s) for s in stop if not isinstance(s, str))
    top_k = int(sp.get("top_k", -1))
    try:
        spec = SampleSpec(
            num_samples=n,
            max_tokens=int(sp.get("max_tokens") or default_max_tokens),
            temperature=float(sp.get("temperature", 1.0)),
            top_k=0 if top_k < 0 else top_k,
            top_p=float(sp.get("top_p", 1.0)),
            seed=sp.get("seed"),
            stop_strings=strings,
            stop_tokens=tokens,
        )
        spec.params(0)  # the engine's own validation (ranges), as a 400 now rather than a failed future
    except (TypeError, ValueError) as exc:
        raise BadInputError(f"sampling_params: {exc}") from None
    return spec


class SamplerPool:
    """Weights by path (the newest ``keep`` saved sets; the base model's always) over one ``engine``."""

    def __init__(self, engine: Engine, base_weights: dict[str, torch.Tensor] | None = None, keep: int = 8):
        self.engine = engine
        self.keep = keep
        self._weights: OrderedDict[str, dict[str, torch.Tensor] | None] = OrderedDict()
        self._weights[BASE] = base_weights  # None: the engine starts on the base model and nothing reloads it
        self._current = BASE
        self._inflight = 0
        self._cond = threading.Condition()
        self._version = 0

    def save(self, path: str, weights: dict[str, torch.Tensor]) -> None:
        """File ``weights`` under ``path`` (dropping the oldest saved set beyond ``keep``)."""
        with self._cond:
            self._weights[path] = weights
            self._weights.move_to_end(path)
            saved = [p for p in self._weights if p != BASE]
            for old in saved[: -self.keep] if len(saved) > self.keep else []:
                if old != self._current:
                    del self._weights[old]

    def has(self, path: str) -> bool:
        with self._cond:
            return path in self._weights

    @contextmanager
    def using(self, path: str) -> Iterator[Engine]:
        """The engine holding ``path``'s weights for the duration of the block."""
        with self._cond:
            if path not in self._weights:
                raise BadInputError(f"no sampler weights at {path!r} (saved: {[p for p in self._weights]})")
            while self._current != path and self._inflight:
                self._cond.wait()
            if self._current != path:
                weights = self._weights[path]
                if weights is None:
                    raise BadInputError(f"{path!r}: the base weights are not kept by this server once replaced")
                self._version += 1
                self.engine.update_weights(weights, version=self._version)
                self._current = path
            self._inflight += 1
        try:
            yield self.engine
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def sample(self, path: str, prompt: RenderedPrompt, spec: SampleSpec) -> list[SampledSequence]:
        """``spec.num_samples`` completions of ``prompt`` under ``path``'s weights (blocking)."""
        with self.using(path) as engine:
            gens = engine.generate([prompt] * spec.num_samples, [spec.params(i) for i in range(spec.num_samples)])
        return [SampledSequence(tuple(g.token_ids), tuple(g.logprobs), g.finish_reason) for g in gens]
