"""Token ids of a conversation that grows a turn at a time, tokenized from where its last render left off.

A multi-turn rollout renders the whole conversation again every turn, and the tokenizer's work grew with it (with
this and uncopied images, maze expert episodes through the per-turn path took 4.04-4.58 ms a turn at easy, not
5.85-6.21: ``benchmarks/expert_render.py``, ``benchmarks/results/expert_render_prefix_ids/``). A fast tokenizer
splits its input at added special tokens before its normalizer and pre-tokenizer see it, so the ids of a text are
the ids of its part before an ``<|im_start|>`` followed by the ids of the rest. Each text's ids up to its last
``<|im_start|>`` are kept by that prefix (an LRU bounded by bytes); a later text that starts with a kept prefix (the
same conversation a turn on, or another episode of its GRPO group) tokenizes only what follows it.

A tokenizer for which that split does not hold (one that adds a BOS token, or whose ``<|im_start|>`` strips the
whitespace before it) is found by a probe at construction and then tokenized whole every time.
"""

from __future__ import annotations

from typing import Any

from vlrl.lru import LruBytes

BOUNDARY = "<|im_start|>"
LOOK_BACK = 16
"""Boundaries tried from the end for a kept prefix (a turn adds two or three: its reply, observations, prompt)."""
_PROBES = (("x \n", f"{BOUNDARY}user\nhi"), ("héllo  ", f"{BOUNDARY}assistant\n"), ("a", BOUNDARY))


class PrefixIds:
    """``ids(text)``: ``tokenizer(text)["input_ids"]``, reusing the ids of the longest kept prefix. Not thread-safe
    (the embedded renderer calls it under its tokenizer lock)."""

    def __init__(self, tokenizer: Any, max_bytes: int = 64 << 20):
        self.tokenizer = tokenizer
        self._kept: LruBytes[tuple[int, ...]] = LruBytes(max_bytes)
        self.tokenized_chars = 0  # _whole counts; the probe's own characters are set back to 0 below
        self.enabled = max_bytes > 0 and all(self._whole(a + b) == self._whole(a) + self._whole(b) for a, b in _PROBES)
        self.tokenized_chars = 0
        """Characters handed to the tokenizer since the probe (what the kept prefixes saved is the rest)."""

    def ids(self, text: str) -> list[int]:
        cuts = _boundaries(text) if self.enabled else []
        if not cuts:
            self.tokenized_chars += len(text)
            return list(self.tokenizer(text)["input_ids"])
        base: tuple[int, ...] = ()
        at = 0
        for cut in reversed(cuts[-LOOK_BACK:]):
            hit = self._kept.get(text[:cut])
            if hit is not None:
                base, at = hit, cut
                break
        last = cuts[-1]
        head = base + self._whole(text[at:last]) if last > at else base
        self._kept.put(text[:last], head, last + 8 * len(head))
        return list(head + self._whole(text[last:]))

    def clear(self) -> None:
        self._kept.clear()

    def _whole(self, text: str) -> tuple[int, ...]:
        self.tokenized_chars += len(text)
        return tuple(self.tokenizer(text)["input_ids"]) if text else ()


def _boundaries(text: str) -> list[int]:
    """Where each ``<|im_start|>`` of ``text`` starts (none at 0: nothing before it to keep)."""
    out, at = [], text.find(BOUNDARY, 1)
    while at >= 0:
        out.append(at)
        at = text.find(BOUNDARY, at + 1)
    return out
