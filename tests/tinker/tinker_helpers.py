"""Helpers of the Tinker-service tests (tests/tinker is on sys.path: test modules ``import tinker_helpers``)."""

from __future__ import annotations

import numpy as np

ARCH = "qwen2_5_vl"
MODEL_NAME = "vlrl-tiny"


def rgb(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def image_conversation(seed: int = 0, size: tuple[int, int] = (56, 84), text: str = "What colour is it?") -> list[dict]:
    from vlrl.messages import image_part

    return [{"role": "user", "content": [image_part(rgb(*size, seed)), {"type": "text", "text": text}]}]
