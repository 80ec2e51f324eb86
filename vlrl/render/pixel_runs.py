"""A conversation's pixel rows, concatenated without copying its earlier images again every turn.

A render hands the engine all of a conversation's images as one ``[n_patches, D]`` tensor, and a multi-turn
episode renders again every turn with one image more. ``torch.cat`` of every image each turn copies the whole
episode's pixels per turn, quadratic in the turns (building maze2d/hard expert episodes on the CPU: 23.4 ms a turn
with it, 16.3 ms with this; ``benchmarks/expert_render.py --pixel-runs``). Here each conversation's rows live in a
buffer with room to grow; a turn writes only its new image's rows after the last turn's, and its tensor is a view of
the buffer's first rows.

Rows once written are never written again: a buffer grows only at its end, and only for the render that extends
exactly what was last written there. So every view handed out keeps its values, and a conversation that branches
(GRPO's repeats after their shared first turn) copies into a buffer of its own. Views of one buffer share its
memory, which also makes the rollout's check that earlier images kept their pixels
(``vlrl.rollout.splice.check_earlier_images``) a comparison of addresses (:func:`same_memory`).

torch is imported inside the functions that use it: importing this module stays light.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vlrl.lru import LruBytes

if TYPE_CHECKING:
    import torch


ROOM = 32
"""A new buffer has room for this many more images of its last image's size (and twice its rows): an untouched
row costs address space, not memory (the pages are only mapped when written), and a full buffer copies all its
rows into a new one."""


class _Buffer:
    """``rows`` ``[capacity, D]``, of which the first ``fill`` are written (and never written again)."""

    def __init__(self, parts: Sequence[torch.Tensor], capacity: int):
        import torch

        first = parts[0]
        dtype = functools.reduce(torch.promote_types, (p.dtype for p in parts))  # as torch.cat promotes
        self.rows = torch.empty((capacity, *first.shape[1:]), dtype=dtype, device=first.device)
        self.fill = 0
        for part in parts:
            self.append(part)

    def fits(self, end: int, part: torch.Tensor) -> bool:
        """Whether ``part`` can be written right after row ``end``: the buffer was last written up to ``end``,
        has room, and holds rows of ``part``'s kind."""
        rows = self.rows
        return (
            end == self.fill
            and end + part.shape[0] <= rows.shape[0]
            and part.shape[1:] == rows.shape[1:]
            and part.dtype == rows.dtype
            and part.device == rows.device
        )

    def append(self, part: torch.Tensor) -> None:
        self.rows[self.fill : self.fill + part.shape[0]].copy_(part)
        self.fill += part.shape[0]


class PixelRuns:
    """``concat(keys, parts)`` equals ``torch.cat(parts)``; a call whose ``keys`` extend an earlier call's by one
    writes only the last part (module docstring). Buffers are kept by their keys in an LRU of ``max_bytes``
    (each charged its written rows); an evicted conversation's next turn copies all its rows once, as ``torch.cat``."""

    def __init__(self, max_bytes: int = 2 << 30):
        self._runs: LruBytes[tuple[_Buffer, int]] = LruBytes(max_bytes)
        self._lock = threading.Lock()

    def concat(self, keys: Sequence[str], parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """``keys``: one per part (an image's pixel hash), naming the parts; ``parts`` ``[n_i, D]`` each."""
        if len(keys) != len(parts) or not parts:
            raise ValueError(f"{len(keys)} keys for {len(parts)} parts (need one key per part, at least one)")
        key = tuple(keys)
        with self._lock:
            hit = self._runs.get(key)
            if hit is not None:
                buf, end = hit
                return buf.rows[:end]
            prev = self._runs.get(key[:-1]) if len(key) > 1 else None
            if prev is not None and prev[0].fits(prev[1], parts[-1]):
                buf = prev[0]
                buf.append(parts[-1])
                self._runs.pop(key[:-1])  # one key per buffer: the conversation's latest
            else:
                rows = sum(int(p.shape[0]) for p in parts)
                buf = _Buffer(parts, capacity=2 * rows + ROOM * int(parts[-1].shape[0]))
            self._runs.put(key, (buf, buf.fill), buf.rows[: buf.fill].nbytes)
            return buf.rows[: buf.fill]

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory (so equal without reading them)."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
    )
