"""For SDK users: an OpenAI-format conversation → a ``tinker.ModelInput`` of text and image chunks.

The conversation is rendered by vlrl's renderer (the chat template, each image's placeholder run); the
ids between placeholder runs become ``EncodedTextChunk``s and each run an ``ImageChunk`` of the image
as PNG (lossless: the server decodes the same pixels) with ``expected_tokens`` = the run's length. The
server renders every image chunk with the same renderer, so the ids it trains on and samples from are
exactly ``rendered.token_ids`` (``tests/tinker`` checks that).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vlrl.messages import prepare_messages

if TYPE_CHECKING:
    import tinker

    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.render.types import RenderedPrompt


def png_bytes(image: Any) -> bytes:
    """A PIL image (or ``[H, W, 3]`` uint8 array) as PNG bytes."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


def conversation_input(
    messages: Sequence[dict[str, Any]], renderer: EmbeddedRenderer, *, add_generation_prompt: bool = True
) -> tuple[tinker.ModelInput, RenderedPrompt]:
    """``(model input, rendered prompt)`` of ``messages``; the model input's ids equal ``rendered.token_ids``."""
    rendered = renderer.render(messages, add_generation_prompt=add_generation_prompt)
    images = prepare_messages(list(messages), limits=renderer.limits).images
    return chunked_input(rendered, images), rendered


def chunked_input(rendered: RenderedPrompt, images: Sequence[Any]) -> tinker.ModelInput:
    """Split ``rendered.token_ids`` at its placeholder runs; ``images`` are the prompt's images in order."""
    from tinker import types

    if len(images) != rendered.n_images:
        raise ValueError(f"{len(images)} images for a prompt with {rendered.n_images} placeholder runs")
    ids = list(rendered.token_ids)
    chunks: list[Any] = []
    at = 0
    for run, image in zip(rendered.placeholders, images):
        if run.offset > at:
            chunks.append(types.EncodedTextChunk(tokens=ids[at : run.offset]))
        chunks.append(types.ImageChunk(data=png_bytes(image), format="png", expected_tokens=run.length))
        at = run.offset + run.length
    if at < len(ids):
        chunks.append(types.EncodedTextChunk(tokens=ids[at:]))
    return types.ModelInput(chunks=chunks)


def append_tokens(model_input: tinker.ModelInput, tokens: Sequence[int]) -> tinker.ModelInput:
    """``model_input`` followed by ``tokens`` (e.g. a sampled completion) as one more text chunk."""
    from tinker import types

    if not tokens:
        return model_input
    return types.ModelInput(chunks=[*model_input.chunks, types.EncodedTextChunk(tokens=list(tokens))])
