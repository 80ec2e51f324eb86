"""The embedded renderer: the checkpoint's own HF processor, in process.

Images are decoded and checked by ``vlrl.messages`` (clear errors with message and part index),
the text comes from the checkpoint's chat template, and the processor expands each image's
placeholder and computes its vision tensors with the torchvision backend (vLLM's).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from vlrl.errors import BadInputError
from vlrl.messages import IMAGE_PART_TYPES, ImageLimits, image_hash, load_image, validate_messages
from vlrl.render.types import PlaceholderRange, RenderedPrompt

# Token strings that would desynchronise images from their placeholders if they appeared in text.
RESERVED_IN_TEXT = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


class EmbeddedRenderer:
    """``render(messages) -> RenderedPrompt`` through a transformers processor."""

    def __init__(self, processor, *, limits: ImageLimits = ImageLimits()):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.limits = limits
        self.image_token_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.merge_size = processor.image_processor.merge_size

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs) -> "EmbeddedRenderer":
        from vlrl.models.load import load_processor

        return cls(load_processor(path), **kwargs)

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[dict[str, Any]] | None = None) -> RenderedPrompt:
        messages = list(messages)
        validate_messages(messages)
        template_messages, images = self._split_images(messages)
        text = self._apply_template(template_messages, add_generation_prompt, tools)
        out = self.processor(text=[text], images=images or None, return_tensors="pt")
        ids = tuple(int(t) for t in out["input_ids"][0])
        grid = out.get("image_grid_thw") if images else None
        pixels = out.get("pixel_values") if images else None
        placeholders = self._placeholders(ids, grid, len(images))
        return RenderedPrompt(token_ids=ids, pixel_values=pixels, image_grid_thw=grid, placeholders=placeholders,
                              image_hashes=tuple(image_hash(im) for im in images), text=text)

    def _split_images(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list]:
        """Decode every image part (in conversation order) and replace it by ``{"type": "image"}``."""
        images, out = [], []
        for mi, msg in enumerate(messages):
            content = msg.get("content")
            if isinstance(content, str):
                self._check_text(content, mi, None)
            if not isinstance(content, list):
                out.append(msg)
                continue
            parts = []
            for pi, part in enumerate(content):
                if part["type"] in IMAGE_PART_TYPES:
                    images.append(load_image(part, message_index=mi, part_index=pi, limits=self.limits))
                    parts.append({"type": "image"})
                else:
                    self._check_text(part["text"], mi, pi)
                    parts.append(part)
            out.append({**msg, "content": parts})
        return out, images

    @staticmethod
    def _check_text(text: str, mi: int, pi: int | None) -> None:
        for token in RESERVED_IN_TEXT:
            if token in text:
                raise BadInputError(f"text contains the reserved vision token {token!r}; images must be "
                                    "image parts, not placeholder text", message_index=mi, part_index=pi)

    def _apply_template(self, messages, add_generation_prompt: bool, tools) -> str:
        from jinja2 import TemplateError

        try:
            return self.processor.apply_chat_template(messages, tokenize=False, tools=tools,
                                                      add_generation_prompt=add_generation_prompt)
        except TemplateError as exc:
            raise BadInputError(f"chat template refused the conversation: {exc}") from None

    def _placeholders(self, ids: tuple[int, ...], grid, n_images: int) -> tuple[PlaceholderRange, ...]:
        """One range per maximal run of image-pad tokens; checked against the grids."""
        runs, start = [], None
        for i, tok in enumerate(ids + (-1,)):
            if tok == self.image_token_id and start is None:
                start = i
            elif tok != self.image_token_id and start is not None:
                runs.append(PlaceholderRange(start, i - start))
                start = None
        if len(runs) != n_images:
            raise RuntimeError(f"rendered {len(runs)} image placeholder runs for {n_images} images")
        for k, run in enumerate(runs):
            want = int(grid[k].prod()) // self.merge_size**2
            if run.length != want:
                raise RuntimeError(f"image {k}: {run.length} pad tokens, but its grid {grid[k].tolist()} "
                                   f"needs {want}")
        return tuple(runs)
