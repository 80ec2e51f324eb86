"""What a renderer returns: exactly the token ids and vision tensors a model sees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PlaceholderRange:
    """The run of ``<|image_pad|>`` tokens of one image: ``token_ids[offset : offset + length]``."""

    offset: int
    length: int


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered conversation.

    token_ids:      the prompt, placeholders already expanded (one ``<|image_pad|>`` per merged patch).
    pixel_values:   ``[n_patches, C * temporal_patch * patch * patch]`` float32 for all images in order,
                    normalised; ``None`` without images. It may share memory with the same conversation's
                    other turns (``vlrl.render.pixel_runs``): read it, never write it in place.
    image_grid_thw: ``[n_images, 3]`` int64 (temporal, height, width in patches); ``None`` without images.
    placeholders:   one :class:`PlaceholderRange` per image, in order.
    image_hashes:   one sha256 per image over its decoded RGB pixels (see ``vlrl.messages.image_hash``).
    text:           the rendered prompt text (for reports and diffs; ``token_ids`` is authoritative).
    engine_features: one opaque payload per image that the renderer's matching engine needs to
                    generate from this prompt (vLLM's processed multimodal kwargs); empty for the
                    embedded renderer. Engines read image offsets from ``placeholders``, never from
                    the payload, so a rollout may splice token ids and shift placeholders freely.
    """

    token_ids: tuple[int, ...]
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    placeholders: tuple[PlaceholderRange, ...]
    image_hashes: tuple[str, ...]
    text: str = ""
    engine_features: tuple[Any, ...] = ()

    @property
    def n_images(self) -> int:
        return len(self.placeholders)

    def vision(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values, image_grid_thw)`` of a prompt with images; ValueError for a text-only one."""
        if self.pixel_values is None or self.image_grid_thw is None:
            raise ValueError("a text-only prompt has no vision tensors")
        return self.pixel_values, self.image_grid_thw

    def __len__(self) -> int:
        return len(self.token_ids)


class Renderer(Protocol):
    """Turns an OpenAI-format conversation into a :class:`RenderedPrompt` (the only place that does).

    Implementations: :class:`vlrl.render.embedded.EmbeddedRenderer` (the HF processor in-process) and
    :class:`vlrl.vllm.renderer.VllmRenderer` (a vLLM server's render route).
    """

    tokenizer: Any
    """The HF tokenizer of the model (token ids are always the renderer's; the tokenizer decodes them)."""

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> RenderedPrompt: ...

    async def arender(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> RenderedPrompt:
        """``render`` from any event loop without blocking it: a renderer behind a server awaits the answer,
        so concurrent episodes render concurrently (rollouts call this)."""
        ...
