"""vLLM's per-image items made from vlrl's own render (``rollout.renderer=embedded``, the default).

A token-in generate request carries each image as vLLM's processed item (``features.kwargs_data``: a base64
msgpack ``MultiModalKwargsItem`` of ``pixel_values`` and ``image_grid_thw``). With the server's render route
(``VllmRenderer``) the server processes the image, sends the item out in the render answer and takes it back in
the generate: every image crosses the wire twice, and the server's one API process both processes it and
(de)serialises it twice, ahead of every generate queued behind (measured on an H100, 2b bf16, 64 fresh images:
render then generate 0.60× raw chat completions; benchmarks/results/vllm_gpu_h100/NOTE.md, run 13).

With the embedded renderer the trainer's process renders (the checkpoint's HF processor, threads in parallel,
an image cache by hash) and the engine builds each item from the prompt's own ``pixel_values``: the image
crosses once, the server processes nothing, and the engine sees exactly the tensors the trainer trains on. The
item's layout (field types, pixel dtype: vLLM 0.26 sends the model dtype, 0.32 float32) is read off one item
the server itself rendered (:class:`ItemCodec`), so no vLLM internals are assumed; that the two renderers agree
is a check the stack runs at start (``vlrl.vllm.stack.check_renderers``) and ``tests/vllm`` runs on every arch.

Items are encoded lazily (:class:`PixelItem`): a later turn names earlier images by hash
(``vlrl.vllm.image_cache``), so only images a server does not hold are ever serialised.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vlrl.errors import BadInputError
from vlrl.render.types import RenderedPrompt
from vlrl.vllm.client import B64

HASH_PREFIX = "vlrl-"
"""vLLM keys its multimodal cache (and prefix-cache blocks) by ``mm_hash``; vlrl's are its sha256 of the decoded
pixels (``vlrl.messages.image_hash``), prefixed so they never meet a hash vLLM made itself."""


def codec_probe() -> list[dict[str, Any]]:
    """A one-image conversation whose render shows a server's item layout (and, at stack start, that the two
    renderers agree: ``vlrl.vllm.stack.check_renderers``)."""
    import numpy as np

    from vlrl.messages import image_part, text_part

    rgb = (np.arange(64 * 80 * 3, dtype=np.uint32).reshape(64, 80, 3) * 2654435761 % 251).astype(np.uint8)
    return [{"role": "user", "content": [image_part(rgb), text_part("vlrl renderer probe")]}]


class ItemCodec:
    """Encodes ``(pixel_values, grid)`` of one image as the server's own render would (field types and dtype
    taken from ``template``, one item that server rendered)."""

    def __init__(self, template: Any):
        """``template``: one rendered item, base64 msgpack (a server's render answer) or vLLM's
        ``MultiModalKwargsItem`` itself (an in-process render, ``vlrl.vllm.inprocess``)."""
        if isinstance(template, str):
            from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import decode_mm_kwargs_item

            item = decode_mm_kwargs_item(template)
        else:
            item = template
        if set(item) != {"pixel_values", "image_grid_thw"}:
            raise ValueError(
                f"vLLM rendered an image item with fields {sorted(item)}; vlrl builds pixel_values and "
                "image_grid_thw only (use rollout.renderer=vllm)"
            )
        self.fields: dict[str, Any] = {k: e.field for k, e in item.items()}
        pixels: Any = item["pixel_values"].data
        self.pixel_dtype = pixels.dtype

    def encode(self, pixels, grid) -> str:
        """``pixels`` ``[n_patches, D]`` (any float dtype, cast to the server's), ``grid`` ``[3]`` int64."""
        from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import encode_mm_kwargs_item

        return encode_mm_kwargs_item(self.item(pixels, grid))

    def item(self, pixels, grid):
        """vLLM's ``MultiModalKwargsItem`` of one image (what :meth:`encode` serialises)."""
        from vllm.multimodal.inputs import MultiModalFieldElem, MultiModalKwargsItem

        pv_field = self.fields["pixel_values"]
        if hasattr(pv_field, "slices"):  # a flat field names its item's rows (one item: all of them)
            pv_field = dataclasses.replace(pv_field, slices=[[slice(0, int(pixels.shape[0]))]])
        return MultiModalKwargsItem(
            {
                "pixel_values": MultiModalFieldElem(pixels.to(self.pixel_dtype).contiguous(), pv_field),
                "image_grid_thw": MultiModalFieldElem(grid.reshape(3).contiguous(), self.fields["image_grid_thw"]),
            }
        )


@dataclass(frozen=True, eq=False)
class PixelItem:
    """One image of a generate body, serialised only if it is sent (:func:`wire`)."""

    codec: ItemCodec
    pixels: Any
    """``[n_patches, D]``."""
    grid: Any
    """``[3]``."""

    @property
    def nbytes(self) -> int:
        """The item's bytes as vLLM's cache counts them (its tensors)."""
        return int(self.pixels.shape[0] * self.pixels.shape[1]) * self.codec.pixel_dtype.itemsize + 24

    def wire(self) -> B64:
        return B64(self.codec.encode(self.pixels, self.grid))


def pixel_items(prompt: RenderedPrompt, codec: ItemCodec) -> list[PixelItem]:
    """One lazy item per image of ``prompt``, cut from its ``pixel_values`` by its grid rows."""
    pixels, grid = prompt.vision()
    out, start = [], 0
    for row in grid:
        n = int(row.prod())
        out.append(PixelItem(codec, pixels[start : start + n], row))
        start += n
    if start != pixels.shape[0]:
        raise ValueError(f"prompt's grids cover {start} patches but pixel_values has {pixels.shape[0]}")
    return out


def wire(body: dict) -> dict:
    """``body`` with every :class:`PixelItem` serialised (``body`` itself when it holds none)."""
    feats = body.get("features") or {}
    items = (feats.get("kwargs_data") or {}).get("image") or []
    if not any(isinstance(x, PixelItem) for x in items):
        return body
    kwargs = {**feats["kwargs_data"], "image": [x.wire() if isinstance(x, PixelItem) else x for x in items]}
    return {**body, "features": {**feats, "kwargs_data": kwargs}}


def generate_features(prompt: RenderedPrompt, image_token_id: int, codec: ItemCodec | None = None) -> dict | None:
    """The ``features`` of a generate request: one item per image at the prompt's own placeholders.

    A prompt the server's render route made carries vLLM's items (``engine_features``, sent as rendered); one
    the embedded renderer made carries none, and its items are built from its ``pixel_values`` with ``codec``.
    Placeholders come from ``prompt.placeholders`` (never from a render answer), so a rollout may splice token
    histories and shift them; each range is checked to still cover a run of image pads."""
    from vlrl.vllm.renderer import VllmImageFeature

    if not prompt.n_images:
        return None
    check_placeholders(prompt, image_token_id)
    feats = prompt.engine_features
    if feats:
        if len(feats) != prompt.n_images or not all(isinstance(f, VllmImageFeature) for f in feats):
            raise BadInputError(
                f"prompt has {prompt.n_images} images but {len(feats)} vLLM image payloads in engine_features"
            )
        hashes, metas = [f.mm_hash for f in feats], [f.metadata for f in feats]
        items = [B64(f.kwargs_data) if isinstance(f.kwargs_data, str) else f.kwargs_data for f in feats]
    else:
        if codec is None:
            raise ValueError("a prompt without vLLM image payloads needs the server's ItemCodec")
        hashes = [HASH_PREFIX + h for h in prompt.image_hashes]
        items, metas = list(pixel_items(prompt, codec)), [None] * prompt.n_images
    return {
        "mm_hashes": {"image": hashes},
        "mm_placeholders": {"image": [{"offset": p.offset, "length": p.length} for p in prompt.placeholders]},
        "kwargs_data": {"image": items},
        "mm_metadata": {"image": metas},
    }


def check_placeholders(prompt: RenderedPrompt, image_token_id: int) -> None:
    """Each of the prompt's placeholder ranges covers a run of image pads (a splice that forgot to shift them
    would otherwise feed an image's features at the wrong tokens)."""
    from vlrl.vllm.renderer import IMAGE_PAD

    for k, p in enumerate(prompt.placeholders):
        run = prompt.token_ids[p.offset : p.offset + p.length]
        if len(run) != p.length or any(t != image_token_id for t in run):
            raise BadInputError(
                f"placeholder {k} ({p.offset}, {p.length}) does not cover a run of {IMAGE_PAD} "
                "tokens in token_ids (was the prompt spliced without shifting placeholders?)"
            )
