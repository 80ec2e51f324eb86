"""What a rollout produces: typed trajectories, exactly the tokens and tensors the engine saw.

A multi-turn trajectory is one token sequence ``prompt_ids + response_ids``. ``prompt_ids`` is the
first render (up to and including the first generation prompt); ``response_ids`` holds every later
token: each turn's generated tokens (loss mask 1, the engine's logprobs) and what the template puts
between turns — the end of the assistant turn, the env's observations and the next generation
prompt (loss mask 0, logprob 0). Generated tokens are the engine's own ids, never a re-tokenisation
of their text ("token in, token out"): re-tokenising the text breaks importance ratios.

In step-wise mode (templates that rewrite history) each turn is its own trajectory: the prompt is
that turn's render and the response its generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from vlrl.render.types import PlaceholderRange

if TYPE_CHECKING:
    import torch

StopReason = Literal["done", "length", "max_turns", "env_error", "engine_error"]
"""Why a trajectory ended:

- ``done``: the env ended the episode.
- ``length``: the context window is full (the next prompt would not fit, or a turn's generation
  was cut by the context).
- ``max_turns``: the rollout's turn budget ran out before the env ended the episode.
- ``env_error``: the env could not be made, its ``init`` or ``step`` raised, or it returned an
  observation that cannot be rendered (``error`` says what); the turns before it are kept, and the
  other episodes of the rollout are not affected.
- ``engine_error``: the engine or a renderer server failed (server down); the turns before it are kept.
"""


@dataclass(frozen=True)
class TurnSpan:
    """One assistant turn, as indices into the full sequence ``prompt_ids + response_ids``.

    ``[obs_start, gen_start)`` are the tokens shown before this turn (the first turn's are the
    whole prompt); ``[gen_start, gen_end)`` the generated tokens, plus an appended end-of-turn
    token when generation stopped without one (``eos_appended``; loss mask 0, logprob 0).
    """

    index: int
    obs_start: int
    gen_start: int
    gen_end: int
    reward: float
    finish_reason: str
    """The engine's: ``stop`` (eos, stop string or stop token) or ``length``."""
    eos_appended: bool
    text: str
    """The assistant message content appended to the conversation for this turn."""
    images_before: int
    """How many images the prompt of this turn held."""


@dataclass(frozen=True)
class Trajectory:
    """One episode (or, step-wise, one turn of it).

    Per-response-token fields (``loss_mask``, ``logprobs``, ``rewards``) have ``len(response_ids)``
    entries. ``pixel_values`` ``[n_patches, D]`` and ``image_grid_thw`` ``[n_images, 3]`` cover every
    image of the sequence in order; ``placeholders`` locate their pad runs in the full sequence.
    """

    uid: str
    group: int
    """Trajectories of the same dataset row share a group (GRPO baselines are per group)."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    rewards: tuple[float, ...]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    placeholders: tuple[PlaceholderRange, ...]
    image_hashes: tuple[str, ...]
    turns: tuple[TurnSpan, ...]
    stop_reason: StopReason
    temperature: float
    """The sampling temperature the logprobs were taken at (the trainer must use the same)."""
    messages: tuple[dict[str, Any], ...] = ()
    """The final conversation (images as data URIs), for reports; the tokens above are authoritative."""
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    weight_version: int = 0
    step_of: str | None = None
    """Step-wise mode: the uid of the episode this turn belongs to."""
    top_logprobs: tuple = ()
    """When requested (``SamplingParams.logprobs_topk``): per response token, the engine's top-k
    ``(id, logprob)`` pairs at generated tokens and ``()`` elsewhere; empty otherwise."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.response_ids

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))

    @property
    def n_images(self) -> int:
        return len(self.placeholders)

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        for name in ("loss_mask", "logprobs", "rewards"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"trajectory {self.uid}: {name} has {len(getattr(self, name))} entries for {n} response tokens"
                )
