"""Multi-turn rollout time per turn vs the number of earlier images (maze2d episodes, an image every turn).

A real rollout (``RolloutGenerator`` over ``episodes`` maze2d/5x5 episodes at once, ``turns`` turns,
sampled actions: the random model never says "stop", so every episode runs all its turns) through a
renderer and an engine wrapped to record when each render starts and each generation ends. Turn ``k``'s
prompt holds ``k`` images (``k - 1`` earlier ones): its time is from its first render's start to its
last generation's end, over all episodes (they advance together). Episodes overlap turns: one whose turn
``k - 1`` ended early renders and queues turn ``k`` while the others still generate, so that span also holds
waiting on turn ``k - 1`` (turn 1 has none). ``increment_seconds`` is what turn ``k`` adds to the rollout's
wall time: its last generation's end minus turn ``k - 1``'s (turn 1: from its first render); the increments
sum to the rollout. The trajectories come back too, for the agreement check against the trainer.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

ENV = "maze2d/5x5"


@dataclass
class _Clock:
    """Render starts and generation ends by the number of images in the prompt."""

    render_start: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    render_seconds: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    gen_end: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    prompt_tokens: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))


class _TimedRenderer:
    """The renderer, unchanged, with each ``render`` call's start and length recorded by its image count."""

    def __init__(self, inner: Any, clock: _Clock):
        self._inner, self._clock = inner, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def render(self, messages, **kwargs):
        t0 = time.perf_counter()
        out = self._inner.render(messages, **kwargs)
        self._record(out, t0)
        return out

    async def arender(self, messages, **kwargs):
        t0 = time.perf_counter()
        out = await self._inner.arender(messages, **kwargs)
        self._record(out, t0)
        return out

    def _record(self, out, t0: float) -> None:
        self._clock.render_start[out.n_images].append(t0)
        self._clock.render_seconds[out.n_images] += time.perf_counter() - t0


class _TimedEngine:
    """The engine, unchanged, with each generation's end recorded by its prompt's image count."""

    def __init__(self, inner: Any, clock: _Clock):
        self._inner, self._clock = inner, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def agenerate(self, prompt, params):
        gen = await self._inner.agenerate(prompt, params)
        self._clock.gen_end[prompt.n_images].append(time.perf_counter())
        self._clock.prompt_tokens[prompt.n_images].append(len(prompt.token_ids))
        return gen


def rollout_turns(renderer, engine, *, episodes: int, turns: int, max_tokens: int) -> tuple[dict, list]:
    """``({"per_turn": [...], ...}, trajectories)`` for ``episodes`` episodes of ``turns`` turns."""
    from vlrl.data.tickets import make_rows, train_seeds
    from vlrl.engines.types import SamplingParams
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

    clock = _Clock()
    config = RolloutConfig(
        sampling=SamplingParams(temperature=1.0, max_tokens=max_tokens), max_turns=turns, seed=0, progress=False
    )
    gen = RolloutGenerator(_TimedRenderer(renderer, clock), _TimedEngine(engine, clock), config)  # type: ignore[arg-type]
    clock.render_start.clear()  # the generator's template check rendered too: not a turn
    clock.render_seconds.clear()
    rows = make_rows(ENV, train_seeds(episodes, 0), {"max_turns": turns})
    t0 = time.perf_counter()
    trajectories = gen.run(rows)
    total = time.perf_counter() - t0
    turns_seen = [k for k in sorted(clock.gen_end) if clock.render_start.get(k)]
    ends = {k: max(clock.gen_end[k]) for k in turns_seen}
    per_turn = [
        {
            "turn": k,
            "earlier_images": k - 1,
            "seconds": round(ends[k] - min(clock.render_start[k]), 4),
            "increment_seconds": round(ends[k] - ends.get(k - 1, min(clock.render_start[k])), 4),
            "render_seconds": round(clock.render_seconds[k], 4),
            "prompt_tokens_mean": round(sum(clock.prompt_tokens[k]) / len(clock.prompt_tokens[k]), 1),
            "requests": len(clock.gen_end[k]),
        }
        for k in turns_seen
    ]
    first, last = per_turn[0]["seconds"], per_turn[-1]["seconds"]
    inc_first, inc_last = per_turn[0]["increment_seconds"], per_turn[-1]["increment_seconds"]
    return {
        "env": ENV,
        "episodes": episodes,
        "turns": turns,
        "max_tokens": max_tokens,
        "total_seconds": round(total, 4),
        "last_over_first_turn": round(last / first, 3) if first else None,
        "last_over_first_increment": round(inc_last / inc_first, 3) if inc_first else None,
        "max_over_first_increment": round(max(t["increment_seconds"] for t in per_turn) / inc_first, 3)
        if inc_first
        else None,
        "per_turn": per_turn,
    }, trajectories
