"""The env contract: what every vlrl environment returns, and the errors it raises on misuse.

An env is made from a dataset row ``{prompt, env_class, extras, seed}`` through the registry
(:mod:`vlrl.envs.registry`). The rollout loop then calls::

    messages, info = env.init(prompt)       # messages: list[dict], the conversation so far
    result = env.step(action_text)          # one assistant turn in, a StepResult out
    ...                                     # until result.done
    env.close()                             # idempotent

``StepResult.reward`` is the reward earned by *that* turn; the episode return is the sum over
turns (each env documents how it spreads its reward). When ``done`` is True, ``observations`` is
empty and any further ``step`` raises :class:`EpisodeDoneError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vlrl.errors import VlrlError

Message = dict[str, Any]
"""One OpenAI-format message, e.g. ``{"role": "user", "content": [text and image_url parts]}``."""

PLACEHOLDER_PROMPT: tuple[Message, ...] = ({"role": "user", "content": "placeholder"},)
"""What an env-ticket row carries as its prompt: the env replaces it with its own first message."""

MAX_ACTION_CHARS = 65536
"""Parsers look at no more than the last this-many characters of an action (model text is unbounded)."""


class EnvError(VlrlError, RuntimeError):
    """An env used against its contract (step before init, unknown env class, bad extras)."""


class EpisodeDoneError(EnvError):
    """``step`` called after the episode ended (``done`` was True) or after ``close``."""


@dataclass(frozen=True)
class StepResult:
    """What ``Env.step`` returns.

    observations: new messages for the conversation (user messages mixing text and image_url
        parts); empty exactly when ``done``.
    reward: reward earned by this turn (finite float).
    done: the episode is over; no more steps.
    metadata: JSON-friendly details (parsed action, feedback, turn index, env facts).
    """

    observations: list[Message]
    reward: float
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Checked at construction so a broken env fails where it builds the result, not in the trainer.
        if not isinstance(self.observations, list):
            raise TypeError(f"observations must be a list of messages, got {type(self.observations).__name__}")
        if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)):
            raise TypeError(f"reward must be a float, got {type(self.reward).__name__}")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward must be finite, got {self.reward}")
        object.__setattr__(self, "reward", float(self.reward))
        if not isinstance(self.done, bool):
            raise TypeError(f"done must be a bool, got {type(self.done).__name__}")
        if not isinstance(self.metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(self.metadata).__name__}")


@runtime_checkable
class Env(Protocol):
    """The interface every vlrl env implements (ours and users'); see the module docstring."""

    max_turns: int

    def init(self, prompt: list[Message] | None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode. ``prompt`` is the dataset row's prompt (a placeholder for env tickets, None
        for a row without one).

        Returns the conversation to show the policy first and a JSON-friendly info dict.
        """
        ...

    def step(self, action_text: str) -> StepResult:
        """Apply one assistant turn (raw model text, untrusted) and return what follows."""
        ...

    def close(self) -> None:
        """Release resources. Safe to call more than once."""
        ...


def is_placeholder(prompt: Any) -> bool:
    """True for an env-ticket prompt: absent, or one message whose content is a plain string."""
    if not prompt:
        return True
    return (
        isinstance(prompt, list)
        and len(prompt) == 1
        and isinstance(prompt[0], dict)
        and isinstance(prompt[0].get("content"), str)
    )


def clip_action(text: Any) -> str:
    """Coerce untrusted model output to a bounded string: the last MAX_ACTION_CHARS characters."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)[:MAX_ACTION_CHARS]
    return text[-MAX_ACTION_CHARS:]
