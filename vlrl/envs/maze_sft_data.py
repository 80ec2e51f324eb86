"""SFT episodes of the maze expert with its detours kept in the history but out of the loss.

The recovery expert (``expert_noise``, :func:`vlrl.envs.maze_text.expert_turns`) plays a detour now and
then and comes back. Trained on as they are, the detours teach the policy to make them (the sampled
policy inherits about ``expert_noise`` of random moves, which GRPO then has to undo); masked, the
policy still sees the mistake and the wall feedback in its context and learns only the way back
(DART-style noise injection with the noise turns out of the loss).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


class DetourRecorder:
    """A rollout ``script`` (the maze expert) that records, per row seed, which of its turns were detours."""

    def __init__(self) -> None:
        self.detours: dict[Any, list[bool]] = {}

    def __call__(self, env: Any, row: Mapping[str, Any]) -> Iterator[str]:
        from vlrl.envs.maze_text import expert_turns

        flags = self.detours.setdefault(row.get("seed"), [])
        flags.clear()
        for text, detour in expert_turns(env, row):
            flags.append(detour)
            yield text


def mask_detours(trajs: Sequence[Any], seeds: Sequence[Any], detours: Mapping[Any, list[bool]]) -> list[Any]:
    """``trajs`` (multi-turn, one per row, ``t.group`` = the row's index in ``seeds``) with the loss mask
    cleared on the generated tokens of every detour turn."""
    out = []
    for t in trajs:
        flags = detours.get(seeds[t.group], [])
        mask, base = list(t.loss_mask), len(t.prompt_ids)
        for span, detour in zip(t.turns, flags, strict=False):
            if detour:
                mask[span.gen_start - base : span.gen_end - base] = [0] * (span.gen_end - span.gen_start)
        out.append(dataclasses.replace(t, loss_mask=tuple(mask)))
    return out


def expert_episodes(run: Any, rows: Sequence[Any], seed: int, *, masked: bool) -> list[Any]:
    """One SFT batch's expert episodes of ``rows`` through ``run.rollout``; detour turns out of the loss
    when ``masked``."""
    recorder = DetourRecorder()
    trajs = run.rollout(rows, seed=seed, repeats=1, script=recorder)
    if not masked:
        return trajs
    return mask_detours(
        trajs,
        [getattr(r, "seed", None) if not isinstance(r, Mapping) else r.get("seed") for r in rows],
        recorder.detours,
    )
