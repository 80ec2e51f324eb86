"""quadrant: which quadrant of the image is the dot in? A user's env module, written against vlrl's env contract.

Frame: ``[image_size, image_size, 3]`` uint8, white, one black disc (the "dot") of radius ``dot_radius`` drawn
wholly inside one of the four quadrants; with ``tinted`` each quadrant has its own background colour (why:
docs/why-didnt-it-learn.md). One turn: the policy answers ``top-left``, ``top-right``,
``bottom-left`` or ``bottom-right`` (bare, or inside ``<answer>...</answer>``; the last tag wins); reward 1 if
right, else 0.

Used as ``data.env = "quadrant_env:make_env"`` once ``vlrl train`` loads envs by module path, or registered by
name from Python (see tests/train/test_quadrant_learns.py)::

    from vlrl.envs.registry import register_env, register_expert
    register_env("quadrant", registry_factory)
    register_expert("quadrant", quadrant_expert)
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from vlrl.envs.contract import EnvError, EpisodeDoneError, Message, StepResult, clip_action
from vlrl.messages import image_part, user_message

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")
TINTS = ((220, 30, 30), (30, 170, 40), (30, 60, 220), (240, 210, 20))
"""Backgrounds (color_square's palette) of top-left, top-right, bottom-left, bottom-right with ``tinted`` on."""
PROMPT = "Which quadrant of the image is the dot in? Answer with one of: " + ", ".join(QUADRANTS) + "."
_TAG = re.compile(r"<answer>\s*([a-z-]{1,20})\s*</answer>", re.IGNORECASE)


def parse_answer(text: str) -> str | None:
    """The quadrant named by ``text`` (last ``<answer>`` tag, else the whole reply), or None."""
    text = clip_action(text)
    tags = _TAG.findall(text)
    word = (tags[-1] if tags else text).strip().strip(".!").strip().lower()
    return word if word in QUADRANTS else None


class QuadrantEnv:
    """See the module docstring. One episode = one image, one answer."""

    max_turns = 1

    def __init__(self, seed: int | None, image_size: int = 128, dot_radius: int = 4, tinted: bool = False):
        if not (1 <= dot_radius and 4 * dot_radius + 2 <= image_size):
            raise EnvError(
                f"quadrant: need 1 <= dot_radius and 4 * dot_radius + 2 <= image_size, got {dot_radius}, {image_size}"
            )
        self.rng = np.random.default_rng(seed)
        self.image_size, self.dot_radius, self.tinted = int(image_size), int(dot_radius), bool(tinted)
        self.quadrant: int | None = None
        self.done = True

    def _frame(self) -> np.ndarray:
        """Draw the dot in a random quadrant, wholly inside it."""
        n, r = self.image_size, self.dot_radius
        self.quadrant = int(self.rng.integers(4))
        half = n // 2
        row0, col0 = (self.quadrant // 2) * half, (self.quadrant % 2) * half
        cy = row0 + int(self.rng.integers(r, half - r))
        cx = col0 + int(self.rng.integers(r, half - r))
        yy, xx = np.mgrid[0:n, 0:n]
        frame = np.full((n, n, 3), 255, dtype=np.uint8)
        if self.tinted:  # each quadrant its own background colour: where the dot is becomes what colour it covers
            for q, tint in enumerate(TINTS):
                frame[(q // 2) * half : (q // 2 + 1) * half, (q % 2) * half : (q % 2 + 1) * half] = tint
        frame[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = 0
        self.centre = (cy, cx)
        return frame

    def init(self, prompt: list[Message] | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.done = False
        frame = self._frame()
        return [user_message(image_part(frame), PROMPT)], {"quadrant": QUADRANTS[self.quadrant or 0]}

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise EpisodeDoneError("quadrant: step after the episode ended; call init first")
        self.done = True
        answer = parse_answer(action_text)
        truth = QUADRANTS[self.quadrant or 0]
        return StepResult([], 1.0 if answer == truth else 0.0, True, {"answer": answer, "quadrant": truth})

    def close(self) -> None:
        self.done = True


def make_env(
    seed: int | None = None, *, image_size: int = 128, dot_radius: int = 4, tinted: bool = False
) -> QuadrantEnv:
    """The factory: ``make_env(seed, **extras) -> env`` (``vlrl check-env quadrant_env:make_env`` calls
    ``make_env(seed)``; a training row's extras arrive as the keywords)."""
    return QuadrantEnv(seed, int(image_size), int(dot_radius), bool(tinted))


def registry_factory(extras: Mapping[str, Any], seed: int | None) -> QuadrantEnv:
    """``make_env`` in the registry's shape ``(extras, seed) -> env`` (vlrl.envs.registry.register_env)."""
    return make_env(seed, **extras)


def quadrant_expert(env: QuadrantEnv, row: Mapping[str, Any]) -> Iterator[str]:
    """SFT expert: the right quadrant, read from the env's state, as the bare answer."""
    yield QUADRANTS[env.quadrant or 0]


def quadrant_format_expert(env: QuadrantEnv, row: Mapping[str, Any]) -> Iterator[str]:
    """Right format, random quadrant (seeded by the row): teaches the format only, leaving the quadrant to RL."""
    yield random.Random(row.get("seed")).choice(QUADRANTS)
