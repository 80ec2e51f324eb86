"""The embedded renderer: the checkpoint's own HF processor, in process.

Messages go through ``vlrl.messages.prepare_messages`` (validation with message and part index,
every image-part form normalised, each image decoded once to the pixels the model receives, as
vLLM decodes them), the text comes from the checkpoint's chat template, and the processor's image
processor computes each image's vision tensors with the torchvision backend (vLLM's).

**Image cache.** A multi-turn episode re-renders the whole conversation every turn, and the image
processor costs ~30 ms per image on a CPU core (a 16-image maze turn: 518 ms, the first turn 25 ms).
Each image's ``(pixel_values, grid)`` is therefore kept by the hash of its decoded pixels (LRU,
``cache_images`` entries), so a turn costs its new image only. The placeholder expansion the
processor would do (each ``<|image_pad|>`` → ``grid.prod() / merge²`` copies, in order) is done here, on the
ids (:meth:`EmbeddedRenderer._expand`); ``tests/foundation/test_render_cache.py`` checks ids, grids and pixels
against the processor's own call. The images' rows are joined by :class:`vlrl.render.pixel_runs.PixelRuns`, which
copies only a turn's new image after the last turn's instead of ``torch.cat`` of all of them every turn.

**Worker threads** (``workers``): torch runs each image-processor op on an OpenMP team as wide as the machine, so
eight render threads on the 16-core GPU host open 128 threads beside the inference servers' processes on the same
cores. The pool is the parallelism: each worker runs its ops on itself (``intra_op_threads``, default 1). Timed on
the H100 against the wide pool in the same rounds, vLLM rollouts moved by less than a round's spread
(benchmarks/results/vllm_gpu_h100/NOTE.md, run 32); the oversubscription is gone either way.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from vlrl.errors import BadInputError
from vlrl.image_decode import ImageLimits
from vlrl.messages import RESERVED_IN_TEXT, as_list, prepare_messages
from vlrl.openmp import limit_openmp_here
from vlrl.render.pixel_runs import PixelRuns
from vlrl.render.prefix_ids import PrefixIds
from vlrl.render.types import PlaceholderRange, RenderedPrompt, Renderer

__all__ = ["EmbeddedRenderer", "RESERVED_IN_TEXT"]


class EmbeddedRenderer:
    """``render(messages) -> RenderedPrompt`` through a transformers processor."""

    def __init__(
        self,
        processor,
        *,
        limits: ImageLimits = ImageLimits(),
        cache_images: int = 4096,
        workers: int = 0,
        intra_op_threads: int | None = 1,
    ):
        """``workers``: threads that ``arender`` renders on (0: in the caller's loop, one at a time). A rollout on
        vLLM renders while the servers generate, so there renders run in parallel (decoding and the image
        processor's torch ops release the GIL); the tokenizer stays one call at a time. ``intra_op_threads``:
        the OpenMP threads of each worker's torch ops (None: torch's default, as wide as the machine)."""
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.limits = limits
        self.image_token = "<|image_pad|>"
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        self.merge_size = processor.image_processor.merge_size
        self.cache_images = cache_images
        self._cache: OrderedDict[str, tuple[Any, Any]] = OrderedDict()  # pixel hash -> (pixel_values, grid)
        self._cache_lock = threading.Lock()
        self._runs = PixelRuns()  # each conversation's pixel rows, extended a turn at a time
        self._ids = PrefixIds(self.tokenizer)  # each conversation's ids, tokenized from where its last render ended
        self._text_lock = threading.Lock()
        self._pool = None
        if workers > 0:
            init = None if intra_op_threads is None else functools.partial(limit_openmp_here, intra_op_threads)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="vlrl-render", initializer=init)

    def forget(self) -> None:
        """Drop the processed images, the conversations' pixel rows and kept ids (what a finished batch of episodes
        left: up to ``cache_images`` images and 2 GiB of rows, ~7 GB at maze2d/easy); the next render starts cold."""
        with self._cache_lock:
            self._cache.clear()
        self._runs.clear()
        with self._text_lock:
            self._ids.clear()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs) -> EmbeddedRenderer:
        from vlrl.models.load import load_processor

        return cls(load_processor(path), **kwargs)

    async def arender(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> RenderedPrompt:
        """``render`` itself, in the caller's loop or (``workers``) on a thread while the loop goes on."""
        if self._pool is None:
            return self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        call = functools.partial(self.render, messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> RenderedPrompt:
        # copy_images=False: the processor only reads
        prepared = prepare_messages(as_list(messages), limits=self.limits, copy_images=False)
        pixels, grid = self._vision(prepared.images, prepared.hashes)
        with self._text_lock:  # a fast tokenizer refuses calls from two threads at once ("Already borrowed")
            text = self._apply_template(_template_messages(prepared.messages), add_generation_prompt, tools)
            template_ids = self._ids.ids(text)
        ids, placeholders = self._expand(template_ids, grid, len(prepared.images))
        return RenderedPrompt(
            token_ids=ids,
            pixel_values=pixels,
            image_grid_thw=grid,
            placeholders=placeholders,
            image_hashes=prepared.hashes,
            text=text,
        )

    def _vision(self, images: Sequence[Any], hashes: Sequence[str]):
        """``pixel_values`` ``[n_patches, D]`` and ``image_grid_thw`` ``[n_images, 3]`` of ``images`` in order
        (None, None without images), each image processed once and then served from the cache."""
        import torch

        if not images:
            return None, None
        parts = []
        for image, key in zip(images, hashes):
            with self._cache_lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
            if hit is None:
                out = self.processor.image_processor(images=[image], return_tensors="pt")
                hit = (out["pixel_values"], out["image_grid_thw"])
                with self._cache_lock:
                    self._cache[key] = hit
                    while len(self._cache) > self.cache_images:
                        self._cache.popitem(last=False)
            parts.append(hit)
        return self._runs.concat(hashes, [p for p, _ in parts]), torch.cat([g for _, g in parts])

    def _expand(self, ids: list[int], grid, n_images: int) -> tuple[tuple[int, ...], tuple[PlaceholderRange, ...]]:
        """The template's ids with each ``<|image_pad|>`` expanded to one per merged patch of its image, and
        each image's placeholder run.

        The ids are the processor's (which expands the text, then tokenizes it): ``<|image_pad|>`` is an added
        special token, split out of the text before the tokenizer's normaliser and pre-tokenizer see it, so the
        text around it tokenizes alike however many there are. Expanding the ids instead of the text keeps the
        tokenizer's work per turn to the conversation's text: a maze episode's 20th turn carried ~1,300 pad
        tokens of its 19 earlier frames through it (``benchmarks/expert_render.py``).
        """
        pad = self.image_token_id
        at = [i for i, t in enumerate(ids) if t == pad]
        if len(at) != n_images or any(b == a + 1 for a, b in itertools.pairwise(at)):
            raise RuntimeError(f"rendered {len(at)} image placeholders (runs of pad tokens) for {n_images} images")
        if not at:
            return tuple(ids), ()
        counts = (grid.prod(-1) // self.merge_size**2).tolist()
        out: list[int] = []
        runs = []
        prev = 0
        for i, n in zip(at, counts, strict=True):
            out += ids[prev:i]
            runs.append(PlaceholderRange(len(out), n))
            out += [pad] * n
            prev = i + 1
        out += ids[prev:]
        return tuple(out), tuple(runs)

    def _apply_template(self, messages, add_generation_prompt: bool, tools) -> str:
        from jinja2 import TemplateError

        try:
            return self.processor.apply_chat_template(
                messages, tokenize=False, tools=tools, add_generation_prompt=add_generation_prompt
            )
        except TemplateError as exc:
            raise BadInputError(f"chat template refused the conversation: {exc}") from None


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages with each image part replaced by ``{"type": "image"}`` (what the template reads)."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, list):
            msg = {**msg, "content": [{"type": "image"} if p["type"] == "image_url" else p for p in content]}
        out.append(msg)
    return out


if TYPE_CHECKING:  # mypy proves here that the class implements the contract
    _renderer: type[Renderer] = EmbeddedRenderer
