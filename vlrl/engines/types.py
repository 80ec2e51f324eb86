"""Engine contract types. Token-in/token-out: a :class:`RenderedPrompt` in, a :class:`Generation` out.

**Logprob contract** (every engine, and the trainer, computes exactly this): the logprob of a
generated token is ``log_softmax(raw_logits / T)[token]`` over the model's vocabulary **without
the five vision placeholder tokens** (``vlrl.models.tokenizer.VISION_TOKENS``: no engine ever
samples them, so the policy is the distribution over the rest), in fp32, where ``T`` is the
request's temperature (``T = 1`` for greedy, ``temperature == 0``). It is taken *before* top-k,
top-p and min-p truncation: those shape what is sampled, not the reported logprob, so the
trainer needs only the logits, ``T`` and the vision ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

if TYPE_CHECKING:
    import torch

    from vlrl.render.types import RenderedPrompt

FinishReason = Literal["stop", "length"]

NamedTensors: TypeAlias = "Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]"
"""Weights for ``Engine.update_weights``: the model's ``named_parameters()`` names and tensors."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's (0 = off)."""
    max_tokens: int = 256
    """Most tokens to generate; fewer if the context would overflow (then finish_reason is 'length')."""
    stop: tuple[str, ...] = ()
    """Stop when the generated text contains one of these strings."""
    include_stop_str_in_output: bool = True
    """Keep the tokens of a matched stop string. If False, the output is cut back to the whole tokens
    that end before the stop string begins (token ids, logprobs and text stay consistent)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end generation (kept in the output)."""
    ignore_eos: bool = False
    """Do not stop on the model's eos ids."""
    seed: int | None = None
    """Per-request seed: the same seed gives the same tokens whatever else is in the batch, on one engine (vLLM's
    model runners V1 and V2 draw differently for one seed)."""
    logprobs_topk: int = 0
    """Also report, per generated token, the k most likely ids with their contract logprobs
    (``Generation.top_logprobs``; the contract's vocabulary, without the vision ids, before truncation, at T).
    0 = off."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.min_p < 0 or self.min_p > 1:
            raise ValueError(f"top_k must be >= 0 and min_p in [0, 1], got {self.top_k}, {self.min_p}")
        if self.logprobs_topk < 0:
            raise ValueError(f"logprobs_topk must be >= 0, got {self.logprobs_topk}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))


@dataclass(frozen=True)
class Generation:
    """One completion: ``token_ids[i]`` was sampled with ``logprobs[i]`` under the logprob contract."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended generation (None for 'length')."""
    text: str = ""
    weight_version: int = 0
    prompt_len: int = 0
    meta: dict = field(default_factory=dict)
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    """With ``SamplingParams.logprobs_topk = k``: per generated token, the k most likely
    ``(token_id, logprob)`` pairs, most likely first, under the same contract as ``logprobs``
    (so the sampled token's pair, when present, carries exactly ``logprobs[i]``). Empty otherwise."""


class Engine(Protocol):
    """An inference engine: what the rollout generator and the trainer's loop use.

    Implementations: :class:`vlrl.engines.embedded.EmbeddedEngine` (in-process transformers) and
    :class:`vlrl.vllm.engine.VllmEngine` (vLLM servers over HTTP); each may take extra keyword
    arguments (``route_key``, ``reference_model``) that callers of the Protocol never need.
    """

    max_context: int
    """Longest prompt + completion, in tokens."""

    @property
    def weight_version(self) -> int:
        """The version of the weights generations are sampled with (``Generation.weight_version``)."""
        ...

    def generate(
        self, prompts: Sequence[RenderedPrompt], params: SamplingParams | Sequence[SamplingParams] = ...
    ) -> list[Generation]:
        """One generation per prompt, in prompt order; one ``params`` for all or one per prompt."""
        ...

    async def agenerate(self, prompt: RenderedPrompt, params: SamplingParams = ...) -> Generation:
        """One request from an event loop (the engine batches concurrent requests)."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int | None = None) -> int:
        """Load new weights (every name must exist, same shapes); returns the new weight version."""
        ...

    def clear_caches(self) -> None:
        """Forget work reused across calls (image features, prefix keys / values): the next call computes
        every prompt from scratch (a check comparing two calls must not have one read the other's cache)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (its threads and, through them, its model and caches; its servers): a run
        that ends must leave nothing behind in a process that goes on (the next run, the next test)."""
        ...
