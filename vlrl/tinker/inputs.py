"""Model-input chunks → the token ids and vision tensors the model sees (a :class:`RenderedPrompt`).

Text chunks are token ids, taken as they are. Each image chunk goes through the serving renderer
(``vlrl.render.embedded.EmbeddedRenderer``, or vLLM's for ``--engine vllm``) as a one-image message,
so its pixels, grid and number of ``<|image_pad|>`` positions are exactly what that renderer gives
every other prompt (the engine's own view); the chunk stands for that run of pad ids, and its
``expected_tokens`` must equal the run's length (a client that counted differently would have
misaligned every target and weight after the image, so the request is refused, naming the image).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vlrl.errors import BadInputError, ContextOverflowError
from vlrl.render.types import PlaceholderRange, RenderedPrompt, Renderer
from vlrl.tinker.wire import Chunk, ImageChunk, TextChunk

MIME = {"png": "image/png", "jpeg": "image/jpeg"}


class ImageRenderer(Renderer, Protocol):
    """A renderer that also names the pad id it expands images into."""

    image_token_id: int


@dataclass(frozen=True)
class InputLimits:
    """Per-sequence limits: tokens (the model's context) and images."""

    max_tokens: int
    max_images: int = 64
    vocab_size: int | None = None
    """Text token ids must be in ``[0, vocab_size)`` (None: unchecked)."""


def render_chunks(
    chunks: Sequence[Chunk], renderer: ImageRenderer, limits: InputLimits, where: str = "model_input"
) -> RenderedPrompt:
    """The prompt of ``chunks``: ids with each image's pad run in place, its vision tensors concatenated in order.

    Raises :class:`BadInputError` for an empty input, an unknown image format, a wrong
    ``expected_tokens``, too many images, or more tokens than ``limits.max_tokens``.
    """
    import torch

    if not chunks:
        raise BadInputError(f"{where}: no chunks")
    images = [c for c in chunks if isinstance(c, ImageChunk)]
    if len(images) > limits.max_images:
        raise BadInputError(f"{where}: {len(images)} images, more than the limit of {limits.max_images}")
    declared = sum(c.length if isinstance(c, TextChunk) else (c.expected_tokens or 0) for c in chunks)
    if declared > limits.max_tokens:  # before any image is decoded
        raise ContextOverflowError(
            declared,
            limits.max_tokens,
            f"{where}: {declared} tokens, more than the model's context of {limits.max_tokens}",
        )
    ids: list[int] = []
    pixels: list[torch.Tensor] = []
    grids: list[torch.Tensor] = []
    placeholders: list[PlaceholderRange] = []
    hashes: list[str] = []
    features: list[Any] = []
    for k, chunk in enumerate(chunks):
        if isinstance(chunk, TextChunk):
            if (
                chunk.tokens
                and limits.vocab_size is not None
                and not 0 <= min(chunk.tokens) <= max(chunk.tokens) < limits.vocab_size
            ):
                raise BadInputError(f"{where} chunk {k}: token ids outside the vocabulary [0, {limits.vocab_size})")
            ids.extend(chunk.tokens)
            continue
        one = render_image(chunk, renderer, f"{where} chunk {k}")
        placeholders.append(PlaceholderRange(len(ids), one.placeholders[0].length))
        ids.extend([renderer.image_token_id] * one.placeholders[0].length)
        assert one.pixel_values is not None and one.image_grid_thw is not None  # checked by render_image
        pixels.append(one.pixel_values)
        grids.append(one.image_grid_thw)
        hashes.extend(one.image_hashes)
        features.extend(one.engine_features)
    if len(ids) > limits.max_tokens:
        raise ContextOverflowError(len(ids), limits.max_tokens)
    return RenderedPrompt(
        token_ids=tuple(ids),
        pixel_values=torch.cat(pixels) if pixels else None,
        image_grid_thw=torch.cat(grids) if grids else None,
        placeholders=tuple(placeholders),
        image_hashes=tuple(hashes),
        engine_features=tuple(features),
    )


def render_image(chunk: ImageChunk, renderer: ImageRenderer, where: str) -> RenderedPrompt:
    """One image chunk rendered alone; its single placeholder run is checked against ``expected_tokens``."""
    if chunk.format not in MIME:
        raise BadInputError(f"{where}: image format {chunk.format!r} is not supported (png, jpeg)")
    url = f"data:{MIME[chunk.format]};base64,{base64.b64encode(chunk.data).decode('ascii')}"
    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
    try:
        one = renderer.render([message], add_generation_prompt=False)
    except BadInputError as exc:
        raise BadInputError(f"{where}: {exc.what}") from None
    if len(one.placeholders) != 1:
        raise BadInputError(f"{where}: the image rendered to {len(one.placeholders)} placeholder runs")
    if one.pixel_values is None or one.image_grid_thw is None:
        raise BadInputError(f"{where}: the renderer gave no vision tensors for the image")
    n = one.placeholders[0].length
    if chunk.expected_tokens is not None and chunk.expected_tokens != n:
        raise BadInputError(
            f"{where}: expected_tokens is {chunk.expected_tokens}, but this image is {n} tokens "
            f"for this model (patch grid {one.image_grid_thw[0].tolist()})"
        )
    return one
