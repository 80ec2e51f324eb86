"""A probe env (a real env of the contract) whose observation kinds, image sizes and faults a test chooses
through ``extras``."""

from __future__ import annotations

import numpy as np

from vlrl.envs.contract import StepResult
from vlrl.messages import image_part, text_part

PROBE = "test/probe"
OBS_KINDS = ("image", "text", "tool", "two_images", "image_and_text_messages")


def _image(rng: np.random.Generator) -> np.ndarray:
    h, w = (int(x) for x in rng.integers(28, 90, size=2))
    return rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)


class ProbeEnv:
    """``extras``: ``kinds`` (one observation kind per turn), ``broken_image_at`` (turn whose
    observation carries a truncated data URI), ``raise_at`` (turn whose step raises)."""

    def __init__(self, extras, seed):
        self.kinds = list(extras.get("kinds", ["image"]))
        self.max_turns = len(self.kinds) + 1
        self.broken_at = extras.get("broken_image_at")
        self.raise_at = extras.get("raise_at")
        self.rng = np.random.default_rng(seed)
        self.turn = 0

    def init(self, prompt):
        return [{"role": "user", "content": [image_part(_image(self.rng)), text_part("Describe, then act.")]}], {}

    def step(self, action_text: str) -> StepResult:
        k, self.turn = self.turn, self.turn + 1
        if k == self.raise_at:
            raise RuntimeError("probe env failure")
        reward = float(len(action_text) % 3) / 2
        if k >= len(self.kinds):
            return StepResult([], reward, True, {})
        return StepResult(self._observation(self.kinds[k], k), reward, False, {"turn": k})

    def _observation(self, kind: str, k: int) -> list[dict]:
        img = image_part(_image(self.rng))
        if k == self.broken_at:
            img = {"type": "image_url", "image_url": {"url": img["image_url"]["url"][:60]}}
        if kind == "image":
            return [{"role": "user", "content": [img, text_part(f"turn {k}")]}]
        if kind == "text":
            return [{"role": "user", "content": f"Feedback {k}: try again."}]
        if kind == "tool":
            return [{"role": "tool", "content": [text_part(f'{{"score": {k}}}')]}]
        if kind == "two_images":
            return [{"role": "user", "content": [img, text_part("and"), image_part(_image(self.rng))]}]
        return [{"role": "user", "content": [img]}, {"role": "user", "content": "second message"}]

    def close(self) -> None:
        pass


def probe_row(kinds, seed=0, **extras) -> dict:
    return {"prompt": None, "env_class": PROBE, "extras": {"kinds": list(kinds), **extras}, "seed": seed}
