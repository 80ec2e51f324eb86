"""Token-history splicing: how turn k+1's prompt is built from turn k's, and the checks that guard it.

The engine generates ``G`` after prompt ``S``. The conversation (source of truth) then gains the
assistant message (``G``'s text) and the env's observations, and is re-rendered to ``R'``. The next
prompt is ``S + G [+ <|im_end|>] + O`` where ``O`` is the part of ``R'`` after the assistant turn:
the engine keeps seeing its own token ids, and every other token comes from the render.

That is only sound if the re-render reproduces history. Before splicing we check that

1. ``R'`` extends the previous render ``R`` token for token up to the ``<|im_start|>`` that opened
   the assistant turn (else :class:`PrefixError`);
2. every earlier image keeps its placeholder, grid, hash and pixel rows (else :class:`PrefixError`;
   step-wise rollouts check this too, :func:`check_earlier_images`);
3. the assistant turn in ``R'`` is exactly the tokenisation of ``"assistant\\n" + text`` followed by
   ``<|im_end|>`` — the template did not rewrite the turn (e.g. drop a ``<think>`` block), else
   :class:`HistoryRewriteError`.

The one place ``R'`` may legitimately differ from ``R`` is the BPE merge of ``"assistant\\n"`` with
the start of the text (a reply starting with a newline merges with it), which check 3 covers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vlrl.errors import VlrlError
from vlrl.render.pixel_runs import same_memory
from vlrl.render.types import PlaceholderRange, RenderedPrompt, Renderer

TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"


class PrefixError(VlrlError):
    """A re-render that does not extend the previous render (history or an earlier image changed)."""


class HistoryRewriteError(PrefixError):
    """The chat template renders an earlier assistant turn differently from its text."""


@dataclass(frozen=True)
class Splice:
    """Where the new observation tokens start in the re-render, and their tokens."""

    obs_tokens: tuple[int, ...]
    obs_start_in_render: int


def _show(tokenizer, ids: Sequence[int], at: int) -> str:
    return repr(tokenizer.decode(list(ids[max(0, at - 3) : at + 3]))) if at < len(ids) else "<end>"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (or where one ends); None if equal."""
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # the usual case, compared at C speed (a maze turn's ids: ~3,000 each turn)
        return None if len(a) == len(b) else n
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _check_prefix(tokenizer, prev: Sequence[int], new: Sequence[int], upto: int, turn: int) -> None:
    at = first_difference(prev[:upto], new[:upto])
    if at is not None:
        raise PrefixError(
            f"turn {turn}: the re-rendered conversation does not extend the previous render; first "
            f"difference at token {at}: previous {prev[at] if at < len(prev) else None} "
            f"{_show(tokenizer, prev, at)} vs new {new[at] if at < len(new) else None} {_show(tokenizer, new, at)}. "
            "The chat template or renderer changed earlier history."
        )


def check_earlier_images(prev: RenderedPrompt, new: RenderedPrompt, turn: int, *, offsets: bool = True) -> None:
    """Every image of ``prev`` is in ``new`` unchanged: hash, placeholder, grid and pixel rows (else
    :class:`PrefixError`). Both rollout modes check this each turn; step-wise mode cannot check the tokens
    (its templates rewrite history, which may move placeholders: ``offsets=False`` compares their lengths)
    but the images must never change."""
    import torch

    n = prev.n_images
    if new.n_images < n or tuple(new.image_hashes[:n]) != tuple(prev.image_hashes):
        raise PrefixError(
            f"turn {turn}: the earlier images changed in the re-render "
            f"(hashes {list(prev.image_hashes)} vs {list(new.image_hashes[:n])})"
        )
    if n == 0:
        return
    moved = [p.offset for p in new.placeholders[:n]] != [p.offset for p in prev.placeholders]
    if (offsets and moved) or [p.length for p in new.placeholders[:n]] != [p.length for p in prev.placeholders]:
        raise PrefixError(
            f"turn {turn}: earlier image placeholders moved: {list(prev.placeholders)} vs {list(new.placeholders[:n])}"
        )
    (new_pixels, new_grid), (prev_pixels, prev_grid) = new.vision(), prev.vision()
    if not torch.equal(new_grid[:n], prev_grid):
        raise PrefixError(f"turn {turn}: earlier image grids changed: {prev_grid.tolist()} vs {new_grid[:n].tolist()}")
    rows = int(prev_grid.prod(-1).sum())
    # The embedded renderer hands a turn's earlier rows as the very memory of the last turn's (PixelRuns).
    if not same_memory(new_pixels[:rows], prev_pixels) and not torch.equal(new_pixels[:rows], prev_pixels):
        raise PrefixError(f"turn {turn}: the pixel values of earlier images changed in the re-render")


def splice_turn(tokenizer, prev: RenderedPrompt, new: RenderedPrompt, text: str, turn: int) -> Splice:
    """Check ``new`` (history + assistant ``text`` + observations) against ``prev`` and cut ``O`` out.

    ``prev`` is the render turn ``turn``'s generation started from; ``text`` the assistant message
    content appended after it.
    """
    start_id = tokenizer.convert_tokens_to_ids(TURN_START)
    end_id = tokenizer.convert_tokens_to_ids(TURN_END)
    prev_ids, new_ids = prev.token_ids, new.token_ids
    if start_id not in prev_ids:
        raise PrefixError(f"turn {turn}: the prompt has no {TURN_START}: not a ChatML generation prompt")
    opened = len(prev_ids) - 1 - tuple(prev_ids)[::-1].index(start_id)  # the last one
    _check_prefix(tokenizer, prev_ids, new_ids, opened + 1, turn)
    check_earlier_images(prev, new, turn)
    head = tokenizer.decode(list(prev_ids[opened + 1 :]))
    want = tuple(tokenizer.encode(head + text, add_special_tokens=False)) + (end_id,)
    got = tuple(new_ids[opened + 1 : opened + 1 + len(want)])
    at = first_difference(want, got)
    if at is not None:
        raise HistoryRewriteError(
            f"turn {turn}: the chat template rendered assistant turn {turn} differently from its text "
            f"(first difference at token {at} of the turn: expected {_show(tokenizer, want, at)}, rendered "
            f"{_show(tokenizer, got, at)}). Templates that rewrite earlier assistant turns (e.g. drop <think> "
            "blocks) cannot give one multi-turn sequence; use step-wise rollouts (mode='step')."
        )
    cut = opened + 1 + len(want)
    return Splice(obs_tokens=tuple(new_ids[cut:]), obs_start_in_render=cut)


def shift_placeholders(ranges: Sequence[PlaceholderRange], delta: int) -> tuple[PlaceholderRange, ...]:
    return tuple(PlaceholderRange(r.offset + delta, r.length) for r in ranges)


PROBE_TEXT = "<think>\nprobe\n</think>\n\nanswer"


def refuse_history_rewrites(renderer: Renderer, tokenizer: Any) -> None:
    """Raise :class:`HistoryRewriteError` if the renderer's template rewrites earlier assistant turns.

    Renders a two-turn text probe whose assistant reply carries a ``<think>`` block — what thinking
    templates drop from history — and splices it like a rollout would.
    """
    first = [{"role": "user", "content": "probe"}]
    prev = renderer.render(first)
    new = renderer.render(first + [{"role": "assistant", "content": PROBE_TEXT}, {"role": "user", "content": "again"}])
    splice_turn(tokenizer, prev, new, PROBE_TEXT, 0)
