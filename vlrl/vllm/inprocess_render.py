"""vLLM's own render in this process (``vllm.LLM``'s chat preprocessing), for :mod:`vlrl.vllm.inprocess`.

The in-process engine's counterpart of :class:`vlrl.vllm.renderer.VllmRenderer`: the same
``RenderedPrompt`` from the same vLLM processor, without a server. Rollouts render with the embedded renderer
(``vlrl.render.embedded``); this one exists so the engine can read vLLM's image-item layout off one item vLLM
itself made (``vlrl.vllm.items.ItemCodec``) and hold the embedded renderer to vLLM's at start
(``vlrl.checks.render_agreement``), as ``vlrl.vllm.stack`` does with a server's render route.

vLLM's offline API renders chat through ``LLM._preprocess_chat_one`` (0.26 and 0.32 alike; no public name
returns the processed prompt): one call, the engine not involved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vlrl.image_decode import ImageLimits
from vlrl.messages import as_list, prepare_messages
from vlrl.render.types import PlaceholderRange, RenderedPrompt
from vlrl.vllm.capabilities import VllmCapabilities, VllmUnsupportedError
from vlrl.vllm.config import VllmServerError
from vlrl.vllm.renderer import IMAGE_PAD


class InprocessRenderer:
    """``render(messages) -> RenderedPrompt`` by an in-process ``vllm.LLM``; ``engine_features`` hold vLLM's items.

    ``run(fn)`` runs ``fn`` where the LLM may be used (the engine's driver thread); default: right here."""

    def __init__(
        self,
        llm,
        tokenizer,
        caps: VllmCapabilities,
        *,
        limits: ImageLimits = ImageLimits(),
        run: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
    ):
        if not hasattr(llm, "_preprocess_chat_one"):
            raise VllmUnsupportedError(
                f"vLLM {caps.version}: LLM has no _preprocess_chat_one, which vlrl's in-process render needs "
                "(use the server engine: rollout.vllm_mode=server)"
            )
        self.llm, self.tokenizer, self.caps, self.limits, self.run = llm, tokenizer, caps, limits, run
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        route_key: Any = None,
    ) -> RenderedPrompt:
        prepared = prepare_messages(as_list(messages), limits=self.limits)
        kw = {"add_generation_prompt": add_generation_prompt, "tools": list(tools) if tools else None}
        rendered = self.run(lambda: self.llm._preprocess_chat_one(prepared.messages, **kw))
        ids = tuple(int(t) for t in rendered["prompt_token_ids"])
        n = len(prepared.images)
        spans = (rendered.get("mm_placeholders") or {}).get("image") or []
        items = list((rendered.get("mm_kwargs") or {}).get("image") or []) if n else []
        if len(spans) != n or len(items) != n:
            raise VllmServerError(f"vLLM rendered {n} images as {len(spans)} placeholders and {len(items)} items")
        placeholders = tuple(PlaceholderRange(int(p.offset), int(p.length)) for p in spans)
        for k, p in enumerate(placeholders):
            if any(t != self.image_token_id for t in ids[p.offset : p.offset + p.length]):
                raise VllmServerError(f"vLLM's placeholder {k} {p} does not cover a run of {IMAGE_PAD}")
        pixels, grid = self._pixels(items) if n else (None, None)
        return RenderedPrompt(
            token_ids=ids,
            pixel_values=pixels,
            image_grid_thw=grid,
            placeholders=placeholders,
            image_hashes=prepared.hashes,
            text=self.tokenizer.decode(list(ids), skip_special_tokens=False),
            engine_features=tuple(items),
        )

    async def arender(self, messages: Sequence[dict[str, Any]], **kwargs) -> RenderedPrompt:
        return self.render(messages, **kwargs)

    def _pixels(self, items: list):
        """Normalised float pixels (float32, or 0.26's model dtype) widened to float32, as the server renderer."""
        import torch

        pixels, grids = [], []
        for item in items:
            data = item.get_data()
            pv, grid = data["pixel_values"], data["image_grid_thw"]
            if not pv.dtype.is_floating_point:
                raise VllmServerError(
                    f"vLLM {self.caps.version} rendered pixel_values of dtype {pv.dtype}, not normalised floats "
                    "(mm_device_do_normalize must be off)"
                )
            pixels.append(pv.to(torch.float32, copy=True))
            grids.append(grid.reshape(-1, 3).to(torch.int64))
        return torch.cat(pixels), torch.cat(grids)
