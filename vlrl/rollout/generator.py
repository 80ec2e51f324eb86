"""The rollout generator: dataset rows × repetitions, many episodes at once against one engine.

    gen = RolloutGenerator(renderer, engine, RolloutConfig(sampling=SamplingParams(max_tokens=64)))
    trajectories = gen.run(rows)                      # rows: EnvRow or {prompt, env_class, extras, seed}

Every episode runs as a coroutine; their requests reach the engine together, which batches them.
Each trajectory passes :func:`vlrl.checks.trajectory.check_trajectory` before it is returned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vlrl.checks.trajectory import check_trajectory
from vlrl.engines.types import Engine, SamplingParams
from vlrl.render.types import Renderer
from vlrl.rollout.episode import EpisodeRunner, EpisodeSpec, Policy, failed_episode
from vlrl.rollout.scripted import Scorer, ScriptedPolicy
from vlrl.rollout.scripted_once import play_once
from vlrl.rollout.splice import refuse_history_rewrites
from vlrl.rollout.types import Trajectory

Script = Callable[[Any, Mapping[str, Any]], Iterable[str | None]]
"""``(env after init, row) -> assistant texts`` (an iterable, read turn by turn, so an expert may
look at the env as the episode goes): a scripted episode instead of sampling. A ``None`` text lets the
engine play that turn."""

NO_ENGINE = "this RolloutGenerator has no engine: it plays scripted episodes only (run(rows, script=...))"


Turns = int | tuple[int, ...] | None
"""A rollout's turn cap: one for every episode, one per dataset row (a tuple), or none."""


def cap_turns(turns: Turns, limit: int | None) -> Turns:
    """``turns`` held within ``limit`` (None: no limit)."""
    if turns is None or limit is None:
        return limit if turns is None else turns
    return tuple(min(t, limit) for t in turns) if isinstance(turns, tuple) else min(turns, limit)


@dataclass(frozen=True)
class RolloutConfig:
    """How to roll out."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling for every turn; its ``seed`` is replaced per turn when ``seed`` below is set."""
    repeats: int = 1
    """Episodes per dataset row (a GRPO group)."""
    max_turns: Turns = None
    """Turn budget per episode, within the env's own ``max_turns`` (None: that); a tuple: one per dataset row."""
    mode: Literal["multi_turn", "step"] = "multi_turn"
    """``multi_turn``: one token sequence per episode (the template must not rewrite history);
    ``step``: one trajectory per turn (for templates that do)."""
    seed: int | None = 0
    """Base of the per-(row, repeat, turn) sampling seeds: the same rows give the same rollouts
    whatever the batching. None = unseeded sampling."""
    max_context: int | None = None
    """Context limit; None = the engine's ``max_context``."""
    progress: bool = True
    """Show a progress bar (on a terminal)."""
    scripts: Literal["render_once", "per_turn"] = "render_once"
    """Scripted episodes without a scorer: played to the end, then rendered once (``vlrl.rollout.scripted_once``:
    the same trajectories, the render work of one turn instead of every turn's); ``per_turn``: the rollout path."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.mode not in ("multi_turn", "step"):
            raise ValueError(f"mode must be 'multi_turn' or 'step', got {self.mode!r}")
        if self.scripts not in ("render_once", "per_turn"):
            raise ValueError(f"scripts must be 'render_once' or 'per_turn', got {self.scripts!r}")


def turn_seed(base: int, group: int, repeat: int, turn: int) -> int:
    """A stable 31-bit seed per (base, group, repeat, turn)."""
    digest = hashlib.sha256(f"{base}/{group}/{repeat}/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class RolloutGenerator:
    """Turns dataset rows into trajectories through a renderer and an engine (or a script).

    ``engine`` may be None for scripted rollouts only (``run(rows, script=...)``); then
    ``config.max_context`` must be set, since no engine supplies it.
    """

    def __init__(
        self,
        renderer: Renderer,
        engine: Engine | None,
        config: RolloutConfig = RolloutConfig(),
        *,
        tokenizer: Any = None,
    ):
        if config.max_context is not None:
            self.max_context = config.max_context
        elif engine is not None:
            self.max_context = engine.max_context
        else:
            raise ValueError("RolloutGenerator without an engine needs config.max_context")
        self.renderer = renderer
        self.engine = engine
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else renderer.tokenizer
        self.image_pad_id = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        self.merge_size = getattr(renderer, "merge_size", 2)
        if config.mode == "multi_turn":
            refuse_history_rewrites(renderer, self.tokenizer)
        self.runner = EpisodeRunner(renderer, self.tokenizer)
        self.replayed = 0
        """Scripted episodes the render-once path handed back to the rollout path (``vlrl.rollout.scripted_once``)."""

    def run(
        self, rows: Sequence[Any], *, script: Script | None = None, scorer: Scorer | None = None
    ) -> list[Trajectory]:
        """Roll out every row ``repeats`` times; trajectories in (row, repeat[, turn]) order."""
        return asyncio.run(self.arun(rows, script=script, scorer=scorer))

    async def arun(
        self, rows: Sequence[Any], *, script: Script | None = None, scorer: Scorer | None = None
    ) -> list[Trajectory]:
        if script is None and self.engine is None:
            raise ValueError(NO_ENGINE)
        caps = self.config.max_turns
        if isinstance(caps, tuple) and len(caps) != len(rows):
            raise ValueError(f"rollout max_turns: {len(caps)} caps (one per row) for {len(rows)} rows")
        jobs = [(g, r, _as_row(row)) for g, row in enumerate(rows) for r in range(self.config.repeats)]
        bar = _progress(len(jobs), self.config.progress)
        done: dict[tuple[int, int], list[Trajectory]] = {}

        async def one(g: int, r: int, row: dict) -> None:
            done[(g, r)] = await self._episode(g, r, row, script, scorer)
            bar.update(1)

        try:
            await asyncio.gather(*(one(*job) for job in jobs))
        finally:
            bar.close()
        return [t for key in sorted(done) for t in done[key]]

    async def _episode(
        self, group: int, repeat: int, row: dict, script: Script | None, scorer: Scorer | None
    ) -> list[Trajectory]:
        """One episode, checked: scripted ones rendered once where that path can (``RolloutConfig.scripts``),
        else (and when it hands one back) through the rollout path."""
        once = script is not None and scorer is None and self.config.scripts == "render_once"
        trajectories = None
        if once and self.config.mode == "multi_turn":
            trajectories = await self._play(group, repeat, row, script, scorer, once=True)
            self.replayed += trajectories is None
        if trajectories is None:
            trajectories = await self._play(group, repeat, row, script, scorer, once=False)
        assert trajectories is not None  # only the render-once path hands an episode back
        for traj in trajectories:
            check_trajectory(traj, image_pad_id=self.image_pad_id, merge_size=self.merge_size)
        return trajectories

    async def _play(
        self, group: int, repeat: int, row: dict, script: Script | None, scorer: Scorer | None, *, once: bool
    ) -> list[Trajectory] | None:
        """Make the env and play it (``once``: :func:`play_once`, None where it cannot); an env that cannot be
        made or started ends only this episode (``env_error``)."""
        from vlrl.envs import env_from_row

        try:
            env = env_from_row(row)
        except Exception as exc:  # noqa: BLE001 — a bad row or env factory loses this episode only
            return [self._failed(group, repeat, row, f"the env could not be made: {type(exc).__name__}: {exc}")]
        try:
            try:
                messages, _ = env.init(row.get("prompt"))
                messages = list(messages)
            except Exception as exc:  # noqa: BLE001 — an env bug loses this episode only
                return [self._failed(group, repeat, row, f"env.init raised {type(exc).__name__}: {exc}")]
            spec = self._spec(group, repeat, env)
            if once and script is not None:
                traj = await play_once(self.runner, env, messages, script(env, row), spec)
                return None if traj is None else [traj]
            policy: Policy
            if script is not None:
                policy = ScriptedPolicy(
                    script(env, row), self.tokenizer, max_context=self.max_context, scorer=scorer, fallback=self.engine
                )
            elif self.engine is not None:
                policy = self.engine
            else:  # arun refuses this before any episode starts
                raise ValueError(NO_ENGINE)
            return await self.runner.run(env, messages, policy, spec)
        finally:
            _close_quietly(env)

    def _failed(self, group: int, repeat: int, row: dict, error: str) -> Trajectory:
        spec = EpisodeSpec(
            uid=f"{group}-{repeat}",
            group=group,
            max_turns=0,
            max_context=self.max_context,
            params=(self.config.sampling,),
            step_wise=self.config.mode == "step",
        )
        return failed_episode(spec, list(row.get("prompt") or []), error)

    def _spec(self, group: int, repeat: int, env) -> EpisodeSpec:
        cfg = self.config
        cap = cfg.max_turns[group] if isinstance(cfg.max_turns, tuple) else cfg.max_turns
        max_turns = int(env.max_turns if cap is None else min(cap, env.max_turns))
        params = tuple(
            cfg.sampling
            if cfg.seed is None
            else dataclasses.replace(cfg.sampling, seed=turn_seed(cfg.seed, group, repeat, k))
            for k in range(max_turns)
        )
        return EpisodeSpec(
            uid=f"{group}-{repeat}",
            group=group,
            max_turns=max_turns,
            max_context=self.max_context,
            params=params,
            step_wise=cfg.mode == "step",
        )


def _close_quietly(env) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 — a failing close must not lose the episode it ends
        pass


def _as_row(row: Any) -> dict:
    return row.as_dict() if hasattr(row, "as_dict") else dict(row)


class _NoBar:
    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


def _progress(total: int, enabled: bool):
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="rollout", unit="episode")
