"""SFT episodes of the maze expert with its detours kept in the history but out of the loss.

The recovery expert (``expert_noise``, :func:`vlrl.envs.maze_text.expert_turns`) plays a detour now and
then and comes back. Trained on as they are, the detours teach the policy to make them (the sampled
policy inherits about ``expert_noise`` of random moves, which GRPO then has to undo); masked, the
policy still sees the mistake and the wall feedback in its context and learns only the way back
(DART-style noise injection with the noise turns out of the loss).

Takeover episodes (:func:`takeover_episodes`) put the policy's own mistakes in the history instead: the policy
(the run's engine, greedy) plays the first k turns of an episode, k drawn per row from 0 to ``turns``, then the
expert plays on from wherever that left the agent (DAgger-style: the states the policy reaches, labelled by the
expert). The policy's turns stay in the history but out of the loss, as detours do. Why: at easy the policy's
failures go down a wrong branch, come back, and take the same branch again (docs/maze.md item 19); the
expert's own detours are random branches, where these are the branches the policy believes in.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


class DetourRecorder:
    """A rollout ``script`` (the maze expert) that records, per row seed, which of its turns were detours. The
    first :meth:`policy_turns` turns (none here) are handed to the engine (``None``) and recorded as detours."""

    def __init__(self) -> None:
        self.detours: dict[Any, list[bool]] = {}

    def policy_turns(self, row: Mapping[str, Any]) -> int:
        return 0

    def __call__(self, env: Any, row: Mapping[str, Any]) -> Iterator[str | None]:
        from vlrl.envs.maze_text import expert_turns

        flags = self.detours.setdefault(row.get("seed"), [])
        flags.clear()
        for _ in range(self.policy_turns(row)):
            flags.append(True)
            yield None
        for text, detour in expert_turns(env, row):
            flags.append(detour)
            yield text


class TakeoverRecorder(DetourRecorder):
    """:class:`DetourRecorder` whose engine plays the first k turns, k drawn per row seed from 0 to ``turns``."""

    def __init__(self, turns: int) -> None:
        super().__init__()
        self.turns = turns

    def policy_turns(self, row: Mapping[str, Any]) -> int:
        return random.Random(f"maze2d-takeover/{row.get('seed')}").randint(0, self.turns)


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
    return mask_detours(trajs, [_seed(r) for r in rows], recorder.detours)


def takeover_episodes(run: Any, rows: Sequence[Any], seed: int, *, turns: int) -> list[Any]:
    """One SFT batch of takeover episodes of ``rows`` (module docstring) through ``run.rollout``, the policy's
    turns greedy (``rollout.eval_temperature``: the states the eval reaches) and out of the loss."""
    recorder = TakeoverRecorder(turns)
    trajs = run.rollout(rows, seed=seed, repeats=1, script=recorder, temperature=run.cfg.rollout.eval_temperature)
    return mask_detours(trajs, [_seed(r) for r in rows], recorder.detours)


def _seed(row: Any) -> Any:
    return row.get("seed") if isinstance(row, Mapping) else getattr(row, "seed", None)
