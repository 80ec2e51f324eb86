"""The embedded renderer: the checkpoint's own HF processor, in process.

Messages go through ``vlrl.messages.prepare_messages`` (validation with message and part index,
every image-part form normalised, each image decoded once to the pixels the model receives, as
vLLM decodes them), the text comes from the checkpoint's chat template, and the processor expands
each image's placeholder and computes its vision tensors with the torchvision backend (vLLM's).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from vlrl.errors import BadInputError
from vlrl.messages import RESERVED_IN_TEXT, ImageLimits, prepare_messages
from vlrl.render.types import PlaceholderRange, RenderedPrompt

__all__ = ["EmbeddedRenderer", "RESERVED_IN_TEXT"]


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
        prepared = prepare_messages(list(messages), limits=self.limits)
        images = list(prepared.images)
        text = self._apply_template(_template_messages(prepared.messages), add_generation_prompt, tools)
        out = self.processor(text=[text], images=images or None, return_tensors="pt")
        ids = tuple(int(t) for t in out["input_ids"][0])
        grid = out.get("image_grid_thw") if images else None
        pixels = out.get("pixel_values") if images else None
        placeholders = self._placeholders(ids, grid, len(images))
        return RenderedPrompt(token_ids=ids, pixel_values=pixels, image_grid_thw=grid, placeholders=placeholders,
                              image_hashes=prepared.hashes, text=text)

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


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages with each image part replaced by ``{"type": "image"}`` (what the template reads)."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, list):
            msg = {**msg, "content": [{"type": "image"} if p["type"] == "image_url" else p for p in content]}
        out.append(msg)
    return out
