"""What the embedded engine reuses across requests: image features by content hash, conversation-prefix KV.

A multi-turn episode sends, each turn, the whole conversation so far: the previous prompt, the tokens the
engine generated for it, then the new observation (``vlrl.rollout.splice``). Without reuse every turn
re-runs the vision tower on every earlier image and re-prefills every earlier token, so a turn's cost grows
with the episode (measured on CPU, tiny model: 2.5x from the first turn to 15 earlier images).

* :class:`VisionCache` keeps each image's vision-tower output by ``(content hash, grid)`` (LRU by bytes);
  a batch encodes each distinct missing image once, in one tower call.
* :class:`PrefixCache` keeps, for each finished request, the decoder's keys and values of every token it
  fed (prompt + generated tokens but the last), with the tokens and the images (offset, hash) they cover
  (LRU by bytes). A new prompt reuses the longest cached prefix whose tokens and images it shares.

Both are valid for one set of weights only: :func:`weights_fingerprint` (each parameter's identity and
autograd version counter, which every in-place write bumps) is checked before each batch and a change
clears both. Nothing here changes what is computed, only what is recomputed: a reused key/value is the
one the same weights computed for the same token at the same mRoPE position (positions are causal: a
token's position depends only on what precedes it), so logprobs stay within the dtype's bound of a
fresh forward (``tests/rollout/test_engine_reuse.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vlrl.lru import LruBytes

if TYPE_CHECKING:
    from vlrl.render.types import RenderedPrompt

BLOCK = 32
"""Prefix index granularity in tokens: a lookup finds a cached entry sharing the prompt's first k·BLOCK
tokens (and images), then extends the match token by token."""


def weights_fingerprint(model: torch.nn.Module) -> int:
    """Changes whenever a parameter is replaced or written in place (``copy_``, an optimizer step)."""
    return hash(tuple((id(p), p._version) for p in model.parameters()))


@dataclass(frozen=True)
class ImageFeatures:
    """One image's vision-tower output, on the model's device in its dtype.

    embeds:    ``[n_tokens, H]``, one row per ``<|image_pad|>`` placeholder of the image.
    deepstack: per deepstack layer ``[n_tokens, H]`` (Qwen3-VL); ``()`` for Qwen2-VL / Qwen2.5-VL.
    """

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embeds, *self.deepstack))

    def rows(self, start: int, stop: int) -> ImageFeatures:
        """The placeholder rows ``[start, stop)`` (an image cut by the start of the recomputed span)."""
        return ImageFeatures(self.embeds[start:stop], tuple(d[start:stop] for d in self.deepstack))


@dataclass(frozen=True)
class ImageInput:
    """One image of a prompt: ``key`` (content hash, t, h, w), ``pixels`` ``[n_patches, D]``, ``grid`` ``[3]``."""

    key: tuple[str, int, int, int]
    pixels: torch.Tensor
    grid: torch.Tensor


class VisionCache:
    """Image features by ``ImageInput.key``; ``encoded`` counts the images the tower has run on."""

    def __init__(self, max_bytes: int):
        self._lru: LruBytes[ImageFeatures] = LruBytes(max_bytes)
        self.encoded = 0

    def clear(self) -> None:
        self._lru.clear()

    def features(self, model, images: Sequence[ImageInput]) -> list[ImageFeatures]:
        """Each image's features, in order: cached ones reused, each distinct missing one encoded once."""
        found: dict[Hashable, ImageFeatures] = {}
        missing: dict[Hashable, ImageInput] = {}
        for img in images:
            hit = found.get(img.key) or self._lru.get(img.key)
            if hit is not None:
                found[img.key] = hit
            else:
                missing.setdefault(img.key, img)
        if missing:
            todo = list(missing.values())
            for img, feats in zip(todo, encode_images(model, todo), strict=True):
                found[img.key] = feats
                self._lru.put(img.key, feats, feats.nbytes)
            self.encoded += len(todo)
        return [found[img.key] for img in images]


def encode_images(model, images: Sequence[ImageInput]) -> list[ImageFeatures]:
    """One vision-tower call over ``images`` (it attends within each image), split per image."""
    visual = model.model.visual
    pixels = torch.cat([i.pixels for i in images]).to(model.device, visual.dtype)
    grid = torch.stack([i.grid for i in images]).to(model.device)
    out = visual(pixels, grid_thw=grid, return_dict=True)
    sizes = (grid.prod(-1) // visual.spatial_merge_size**2).tolist()
    embeds = torch.split(out.pooler_output.to(model.dtype), sizes)
    deep = [torch.split(d.to(model.dtype), sizes) for d in (getattr(out, "deepstack_features", None) or [])]
    return [ImageFeatures(e, tuple(d[k] for d in deep)) for k, e in enumerate(embeds)]


@dataclass(frozen=True)
class PrefixEntry:
    """The decoder keys / values of ``token_ids`` (one finished request's fed tokens).

    images:        ``(offset, hash)`` of each image whose placeholders lie in ``token_ids``, in order.
    keys, values:  ``[layers, kv_heads, T, head_dim]``, ``T = len(token_ids)``, model dtype and device.
    """

    token_ids: tuple[int, ...]
    images: tuple[tuple[int, str], ...]
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


def _block_keys(token_ids: Sequence[int], images: Sequence[tuple[int, str]]) -> list[int]:
    """Chained hashes of the first ``k·BLOCK`` tokens (and the hashes of the images starting there), k >= 1."""
    out, h, at = [], 0, 0
    for end in range(BLOCK, len(token_ids) + 1, BLOCK):
        starting = []
        while at < len(images) and images[at][0] < end:
            starting.append(images[at][1])
            at += 1
        h = hash((h, tuple(token_ids[end - BLOCK : end]), tuple(starting)))
        out.append(h)
    return out


class PrefixCache:
    """Finished requests' KV by token prefix (LRU by bytes)."""

    def __init__(self, max_bytes: int):
        self._lru: LruBytes[PrefixEntry] = LruBytes(max_bytes)
        self._index: dict[int, int] = {}  # block key -> entry id (the latest entry with that prefix)
        self._next = 0

    @property
    def enabled(self) -> bool:
        return self._lru.max_bytes > 0

    def __len__(self) -> int:
        return len(self._lru)

    def clear(self) -> None:
        self._lru.clear()
        self._index.clear()

    def add(self, entry: PrefixEntry) -> None:
        eid, self._next = self._next, self._next + 1
        keys = _block_keys(entry.token_ids, entry.images)
        if not keys:
            return  # shorter than a block: never found, not worth its memory
        for gone in self._lru.put(eid, entry, entry.nbytes):
            self._index = {k: v for k, v in self._index.items() if v != gone}
        if self._lru.get(eid) is not None:
            self._index.update((k, eid) for k in keys)

    def lookup(self, token_ids: Sequence[int], images: Sequence[tuple[int, str]]) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest prefix with the prompt and that prefix's length (< ``len(token_ids)``:
        the last prompt token is always recomputed, its hidden state predicts the first new token)."""
        for key in reversed(_block_keys(token_ids, images)):
            eid = self._index.get(key)
            entry = None if eid is None else self._lru.get(eid)
            if entry is not None:
                return entry, _shared(entry, token_ids, images, len(token_ids) - 1)
        return None, 0


def _shared(entry: PrefixEntry, token_ids: Sequence[int], images: Sequence[tuple[int, str]], limit: int) -> int:
    """Length of the common prefix of ``entry`` and the prompt (tokens and images), at most ``limit``."""
    n = min(limit, len(entry.token_ids))
    a = torch.tensor(entry.token_ids[:n])
    b = torch.tensor(list(token_ids[:n]))
    diff = (a != b).nonzero()
    n = int(diff[0, 0]) if len(diff) else n
    for (off, h), (e_off, e_h) in zip(images, entry.images):
        if off >= n:
            break
        if off != e_off or h != e_h:
            return off
    if len(images) > len(entry.images) and images[len(entry.images)][0] < n:
        return images[len(entry.images)][0]  # an image the entry never saw (cannot happen with equal tokens)
    return n


# ---------------------------------------------------------------------- the engine's batch, with reuse


def image_keys(prompt: RenderedPrompt) -> tuple[tuple[int, str], ...]:
    """``(placeholder offset, content hash)`` of each image of ``prompt``, in order."""
    return tuple((ph.offset, h) for ph, h in zip(prompt.placeholders, prompt.image_hashes))


def cached_prefix(prefix: PrefixCache, model, prompts: Sequence[RenderedPrompt], width: int):
    """``(cache, start, recompute)`` for a left-padded ``[B, width]`` batch of ``prompts``: a transformers
    ``DynamicCache`` holding columns ``[0, start)`` from the prefix cache (zeros on padding; ``start`` 0 when
    nothing can be reused) and ``recompute = width - start``, the columns the prefill still runs."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    hits = [prefix.lookup(p.token_ids, image_keys(p)) if prefix.enabled else (None, 0) for p in prompts]
    lens = [len(p.token_ids) for p in prompts]
    recompute = max(n - shared for n, (_, shared) in zip(lens, hits))
    start = width - recompute
    if start <= 0:
        return cache, 0, width
    first = next(e for e, _ in hits if e is not None)
    layers, heads, _, dim = first.keys.shape
    keys = first.keys.new_zeros((layers, len(prompts), heads, start, dim))
    values = torch.zeros_like(keys)
    for b, (n, (entry, _)) in enumerate(zip(lens, hits)):
        m = n - recompute  # this row's tokens in the reused columns (it has an entry when m > 0)
        if m > 0 and entry is not None:
            keys[:, b, :, start - m :] = entry.keys[:, :, :m]
            values[:, b, :, start - m :] = entry.values[:, :, :m]
    for layer in range(layers):
        cache.update(keys[layer], values[layer], layer)
    return cache, start, recompute


def new_embeddings(
    vision: VisionCache, model, prompts: Sequence[RenderedPrompt], ids: torch.Tensor, start: int
) -> tuple[torch.Tensor, dict]:
    """Input embeddings ``[B, W - start, H]`` of the recomputed columns of the left-padded ``ids`` ``[B, W]``,
    image features scattered in (from ``vision``: each image encoded at most once), and Qwen3-VL's deepstack
    keyword arguments where the model has them (``{}`` otherwise)."""
    new_ids = ids[:, start:]
    embeds = model.get_input_embeddings()(new_ids)
    images, spans = [], []
    for p in prompts:
        if not p.n_images:
            continue
        lo = max(0, len(p.token_ids) - new_ids.shape[1])  # this row's first recomputed token
        pixels, grid = p.vision()
        rows = torch.split(pixels, grid.prod(-1).tolist())
        for k, (ph, h) in enumerate(zip(p.placeholders, p.image_hashes)):
            if ph.offset + ph.length > lo:
                t, hh, w = (int(x) for x in grid[k].tolist())
                images.append(ImageInput((h, t, hh, w), rows[k], grid[k]))
                spans.append((max(ph.offset, lo) - ph.offset, ph.length))
    if not images:
        return embeds, {}
    feats = [f.rows(a, b) for f, (a, b) in zip(vision.features(model, images), spans)]
    mask = new_ids == model.config.image_token_id
    flat = torch.cat([f.embeds for f in feats])
    if int(mask.sum()) != flat.shape[0]:
        raise RuntimeError(f"{int(mask.sum())} image placeholders to fill, {flat.shape[0]} feature rows")
    embeds = embeds.masked_scatter(mask[..., None], flat.to(embeds.dtype))
    if not feats[0].deepstack:
        return embeds, {}
    deep = [torch.cat([f.deepstack[j] for f in feats]) for j in range(len(feats[0].deepstack))]
    return embeds, {"visual_pos_masks": mask, "deepstack_visual_embeds": deep}


STACK_BYTES = 256 << 20
"""Most bytes of finished rows' keys / values :func:`prefix_entries` stacks at once (then copies out per row)."""


def prefix_entries(finished: Sequence[tuple[RenderedPrompt, Sequence[int], int]], cache) -> list[PrefixEntry]:
    """The entries of finished batch rows of a transformers KV ``cache``, one per ``(prompt, fed, row)``: the
    row's ``prompt`` then the generated tokens ``fed`` back into the model, which are the row's last columns (the
    batch is left-padded, and every decode step adds a real column to each row still in it).

    Rows are taken from each layer together (an ``index_select`` per layer for as many rows as fit in
    :data:`STACK_BYTES`, then one copy per row), not sliced row by row and layer by layer: 256 rows finishing
    together were ~57,000 small ops of host time (benchmarks/results/engine_profile)."""
    if not finished:
        return []
    first = cache.layers[0].keys
    per_row = 2 * sum(layer.keys[0].numel() for layer in cache.layers) * first.element_size()
    step = max(1, STACK_BYTES // per_row)
    out: list[PrefixEntry] = []
    for lo in range(0, len(finished), step):
        chunk = finished[lo : lo + step]
        index = torch.tensor([row for _, _, row in chunk], device=first.device)
        keys = torch.stack([layer.keys.index_select(0, index) for layer in cache.layers], dim=1)  # [R, L, H, T, D]
        values = torch.stack([layer.values.index_select(0, index) for layer in cache.layers], dim=1)
        for k, (prompt, fed, _) in enumerate(chunk):
            token_ids = tuple(prompt.token_ids) + tuple(fed)
            n = len(token_ids)
            if keys.shape[3] < n:
                raise RuntimeError(f"a finished row holds {keys.shape[3]} cached positions for {n} fed tokens")
            # copies: an entry must not keep the stacked rows alive (the LRU counts each entry's own bytes)
            own = (x[k, :, :, -n:].clone(memory_format=torch.contiguous_format) for x in (keys, values))
            out.append(PrefixEntry(token_ids, image_keys(prompt), *own))
    return out
