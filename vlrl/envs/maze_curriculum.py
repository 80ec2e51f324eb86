"""The maze curriculum: one level after another (5x5 -> 7x7 -> easy -> hard), each trained by SFT on the
BFS expert's recovery demonstrations and then GRPO on the maze's sparse reward, under a wall-clock budget.

A GPU command may run 10 minutes, so a level's phases are time-budgeted rather than step-counted: SFT
steps until ``sft_seconds``, then RL steps until ``rl_seconds`` (evaluations included), each loop ending
before it would overrun. The training itself is the trainer's own (``vlrl.train.run.Run``, the SFT step of
``vlrl.train.loop.sft`` and ``vlrl.train.loop.rl_step``, with ``run.agreement=stop``); this module adds
the clock, evaluation on a fixed seeded split with a 95 % interval and rollout samples of solved and failed
mazes, and the hand-over of the weights from one level to the next (``model.path``).

    from vlrl.envs.maze_curriculum import LevelPlan, train_level
    result = train_level(LevelPlan("5x5", sft_seconds=150, rl_seconds=240), out="runs/maze_5x5")

torch and the trainer are imported inside the functions: importing this module stays light.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlrl.envs.maze_weights import Snapshots, save_weights

if TYPE_CHECKING:
    from vlrl.envs.maze2d import Start
    from vlrl.envs.maze_models import CurriculumModel, ImageStats
    from vlrl.envs.maze_sft_pool import PoolFill
    from vlrl.models.build import InitScheme

EVAL_SEED = 10_000_019
"""The eval rollouts' sampling seed (greedy anyway), the one ``Run.evaluate`` uses."""


@dataclass(frozen=True)
class LevelPlan:
    """One curriculum level: its env, the clock budgets of its phases and its recipe overrides."""

    level: str
    """maze2d level: 5x5, 7x7, easy or hard."""
    sft_seconds: float
    """Wall-clock budget of the SFT phase (from the level's start)."""
    rl_seconds: float
    """Wall-clock budget of the RL phase (from the end of SFT), its evaluations included."""
    overrides: tuple[str, ...] = ()
    """``section.key=value`` overrides on top of the ``maze_curriculum`` recipe."""
    eval_every: int = 0
    """Evaluate every N RL steps as well (0: only after SFT and at the end)."""
    sft_pool: int = 48
    """SFT batches kept and cycled over (see :func:`sft_phase`)."""
    sft_fill: PoolFill = "first"
    """How the pool fills (:mod:`vlrl.envs.maze_sft_pool`): the first steps each build a batch, or a thread or
    worker processes build batches throughout the phase while the steps train (a sliding window of the freshest)."""
    sft_builders: int = 0
    """Worker processes of ``sft_fill="processes"`` (0: all cores but two, at most 12 GiB of free memory each)."""
    sft_prefetch: bool = False
    """Fetch (and on a GPU copy) each step's batch while the step before it trains (:mod:`vlrl.envs.maze_sft_pool`)."""
    sft_lr_scale: tuple[tuple[str, float], ...] = ()
    """SFT learning rate per module group as a factor of ``sft.lr`` (e.g. ``(("vision", 10.0),)``)."""
    mask_detours: bool = False
    """Keep the recovery expert's detour turns out of the SFT loss (see :mod:`vlrl.envs.maze_sft_data`)."""
    model: CurriculumModel = "tiny"
    """The random-init model of the first level: vlrl's ``tiny`` or :data:`vlrl.envs.maze_models.SMALL` (later
    levels continue from the weights the previous one ended with)."""
    init: InitScheme = "normal"
    """How that random-init model's weights are drawn (:data:`vlrl.models.build.InitScheme`): ``fan_in`` keeps
    the image's signal through the narrow models' layers (``normal``'s std 0.02 shrinks it ~6x per matrix)."""
    image_side: int | None = None
    """That random-init model's largest frame side in px, kept unresized (None: tiny's 224 px)."""
    image_stats: ImageStats = "model"
    """That random-init model's pixel normalisation: the architecture's constants or the maze frames' own
    (:data:`vlrl.envs.maze_models.MAZE_IMAGE_STATS`: walls and floor then differ in sign, not only in scale)."""
    eval_before: bool = False
    """Evaluate the starting weights too (0 % at random init: skipped to save the budget)."""
    sft_warmup_steps: int = 0
    """SFT steps over which the lr ramps up linearly (then the clock's decay): a new AdamW's first steps move every
    weight by about the lr whatever its gradient. Steps, not seconds: a level's first step may end 15-30 s into it,
    past a ramp of 10 s (lease_v2: a 62 % easy policy's loss 0.030 -> 0.323; docs/maze.md item 27)."""
    first_turns: float = 0.0
    """Seconds of SFT on the expert's first turns alone (each row cut to its first move) before whole episodes: the
    image alone decides a first move, where in a whole episode the history decides most."""
    first_start: Start = "corner"
    """Where the first-turn rows put the agent: the level's corners (VisGym's starts) or ``random`` floor tiles (each
    first move read from a different spot among the walls)."""
    sft_until: float = 0.0
    """End SFT early once greedy success on ``probe_rows`` training mazes reaches this fraction (probed at most
    every ``probe_seconds`` once whole episodes train; 0: the budget runs out): where GRPO has a reward and room."""
    probe_rows: int = 32
    """Training mazes in the probe, drawn from the training stream when SFT starts (0 with ``sft_until`` 0)."""
    probe_seconds: float = 10.0
    """Seconds from one probe to the next (each probe is a greedy rollout of ``probe_rows`` episodes)."""
    takeover: tuple[int, int] = (0, 12)
    """(N, M): every N-th SFT step (N > 0) starts a batch of takeover episodes, the policy playing up to M turns
    before the expert (:mod:`vlrl.envs.maze_sft_pool`); 0: expert episodes only."""
    fork_mazes: tuple[float, int] = (0.0, 1)
    """(share, draw): whole-episode SFT batches pick ``share`` of their rows from ``draw`` times as many candidates,
    those with an away fork (:mod:`vlrl.envs.maze_sft_pool`); (0, 1): the rows as drawn."""
    snapshot_seconds: float = 0.0
    """Save the weights every N seconds of SFT under ``<out>/snapshots`` (:class:`vlrl.envs.maze_weights.Snapshots`),
    for a process that trains a whole device lease; 0: only at the level's end."""


@dataclass(frozen=True)
class EvalResult:
    """Greedy success on the level's fixed eval split."""

    label: str
    solved: int
    episodes: int
    low: float
    high: float
    """The 95 % Wilson score interval of the success rate."""
    within_visgym: int | None = None
    """Solved within VisGym's number of turns (``maze_text.VISGYM_TURNS``; None for the levels it lacks)."""
    cut_by_context: int = 0
    """Ended by the model's context before the turn budget (``stop_reason`` length; hard: turn 37 of 46 at 4,096)."""

    @property
    def success(self) -> float:
        return self.solved / max(1, self.episodes)


@dataclass(frozen=True)
class LevelResult:
    """What one level reached, and what it cost."""

    level: str
    out: str
    sft_steps: int
    sft_episodes: int
    """Distinct expert episodes the SFT steps cycled over."""
    rl_steps: int
    sft_seconds: float
    rl_seconds: float
    evals: tuple[EvalResult, ...]
    weights: str
    """The model directory holding the level's final weights (the next level's ``model.path``)."""
    config: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        evals = [asdict(e) | {"success": e.success} for e in self.evals]
        return asdict(self) | {"evals": evals}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``k / n`` (95 % at z = 1.96)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def level_config(plan: LevelPlan, out: str | Path, model_path: str | Path | None = None):
    """The level's TrainConfig: the ``maze_curriculum`` recipe, its env, the plan's overrides."""
    from vlrl.train.config import load_config

    sets = [f"data.env=maze2d/{plan.level}", f"name=maze_{plan.level}", *plan.overrides]
    sets += [f"model.path={model_path}"] if model_path else []
    return load_config("maze_curriculum", [*sets, f"run.out={out}", "run.progress=False"])


def greedy_rollouts(run, rows) -> list:
    """One episode per row at the eval temperature (greedy by default), seeded as ``Run.evaluate``."""
    return run.rollout(rows, seed=EVAL_SEED, temperature=run.cfg.rollout.eval_temperature, repeats=1, shared=False)


def evaluate(run, step: int, label: str, keep: int = 4) -> EvalResult:
    """``Run.evaluate`` with the success count, its interval, and samples of solved *and* failed episodes
    (half each where there are both) instead of the first few; logs its seconds (``eval_s``) and, on the embedded
    engine, those the engine spent decoding (``eval_decode_s``; the rest is host work: renders, env steps)."""
    from vlrl.envs.maze_text import VISGYM_TURNS
    from vlrl.rollout.io import write_jsonl

    counter = getattr(run.engine, "stats", {}).get  # the embedded engine's: the seconds it spent decoding
    busy, t0 = counter("decode_s"), time.time()
    trajs = greedy_rollouts(run, run.eval_rows)
    took = {"eval_s": time.time() - t0} | ({} if busy is None else {"eval_decode_s": counter("decode_s") - busy})
    solved = [t for t in trajs if t.total_reward > 0]
    failed = [t for t in trajs if t.total_reward <= 0]
    low, high = wilson(len(solved), len(trajs))
    budget = VISGYM_TURNS.get(run.cfg.data.env.removeprefix("maze2d/"))
    within = None if budget is None else sum(len(t.turns) <= budget for t in solved)
    cut = sum(t.stop_reason == "length" for t in trajs)
    result = EvalResult(label, len(solved), len(trajs), low, high, within, cut)
    mean = sum(t.total_reward for t in trajs) / max(1, len(trajs))
    stats = {"eval_reward_mean": mean, "eval_success": result.success, "label": label} | took
    run.log.metrics(step, "eval", stats | {"eval_episodes": len(trajs), "success_low": low, "success_high": high})
    half = keep // 2
    shown = solved[: max(half, keep - len(failed))] + failed[: max(half, keep - len(solved))]
    write_jsonl(shown[:keep], run.log.dir / "samples" / f"step_{step:06d}.jsonl")
    return result


def sft_lr_factor(elapsed: float, budget: float, step: int = 0, warmup_steps: int = 0) -> float:
    """The SFT lr as a fraction of its peak for 0-based ``step``, ``elapsed`` seconds into a phase of ``budget``
    seconds: a linear decay to 10 % at the end, times the RL trainer's warm-up ramp over ``warmup_steps`` steps
    (:func:`vlrl.train.trainer.warmup_factor`: step k at (k + 1) / warmup_steps)."""
    from vlrl.train.trainer import warmup_factor

    factor = max(0.1, 1.0 - elapsed / max(1e-9, budget))
    if warmup_steps > 0:
        factor *= warmup_factor(step, warmup_steps)
    return factor


def sft_phase(run, deadline: float, plan: LevelPlan) -> tuple[int, int]:
    """SFT steps (cross-entropy on expert episodes, its own AdamW, as ``vlrl.train.loop.sft``) until ``deadline``,
    or until the probe reaches ``plan.sft_until``; the engine gets the weights at the end. Returns (steps, episodes).

    The batches come from a pool of ``plan.sft_pool`` kept batches (:class:`vlrl.envs.maze_sft_pool.SftPool`, filled
    as ``plan.sft_fill`` says; ``plan.sft_prefetch``: fetched and copied during the step before); the first
    ``plan.first_turns`` seconds' rows are cut to their first turn. A step starts only while the last step's time
    still fits; its metrics split it: ``batch_s`` and ``to_device_s`` the wait for the batch and its copy (or what
    the prefetch did not hide), ``update_s``. The lr (``sft.lr`` times the group's factor in ``plan.sft_lr_scale``)
    decays linearly with the clock to 10 % at the deadline, after a linear ramp from 0 over ``plan.sft_warmup_steps``
    steps. ``plan.mask_detours``: the recovery expert's detour turns stay in the history but out of the loss
    (:mod:`vlrl.envs.maze_sft_data`)."""
    from vlrl.envs.maze_sft_pool import SftPool
    from vlrl.train.trainer import Trainer

    cfg = run.cfg
    optim = dataclasses.replace(cfg.optim, lr=cfg.sft.lr, lr_scale=dict(plan.sft_lr_scale), warmup_steps=0)
    trainer = Trainer(run.model, cfg.algo, optim)  # lr=None: per-group rates from optim.lr_scale (own clock)
    base = [g["lr"] for g in trainer.optimizer.param_groups]
    pool = SftPool(
        run,
        plan.sft_pool,
        masked=plan.mask_detours,
        fill=plan.sft_fill,
        deadline=deadline,
        builders=plan.sft_builders,
        first_start=plan.first_start,
        takeover=plan.takeover,
        forks=plan.fork_mazes,
        prefetch=plan.sft_prefetch,
    )
    probe = run.next_rows(plan.probe_rows) if plan.sft_until else []
    snapshots = Snapshots(run, run.log.dir / "snapshots", plan.snapshot_seconds)
    k, last, t0, probed = 0, 0.0, time.time(), time.time()
    try:
        while k < cfg.sft.steps and time.time() + last < deadline:
            t = time.time()
            decay = sft_lr_factor(t - t0, deadline - t0, k, plan.sft_warmup_steps)
            for group, lr in zip(trainer.optimizer.param_groups, base, strict=True):
                group["lr"] = lr * decay
            first = t - t0 < plan.first_turns
            if probe and not first and t - probed >= plan.probe_seconds:
                probed = time.time()
                if probe_success(run, probe, k) >= plan.sft_until:
                    break
            t_step = time.time()  # no reference to the batch after the update: its GPU copy goes with it
            values = run.sft_update(trainer, pool.batch(k, first, None if run.dist.sharded else trainer.device))
            k += 1
            run.state.sft_step = k
            extra = {"sft_episodes": pool.built[False] * cfg.sft.rows_per_step, "first_turns": float(first)}
            extra |= {"takeovers": float(pool.takeovers), "takeover_s": pool.takeover_s}
            extra |= {"batch_s": pool.wait_s, "to_device_s": pool.copy_s}
            extra["update_s"] = time.time() - t_step - pool.wait_s - pool.copy_s
            run.log.metrics(k, "sft", values | extra | {"lr_factor": decay})
            snapshots.maybe(k)
            last = time.time() - t
    finally:
        pool.close()
    run.sync_weights()
    return k, pool.episodes()


def probe_success(run, rows, step: int) -> float:
    """Greedy success of the current weights on ``rows`` (training mazes, not the eval split), logged as a
    ``probe`` metric at SFT ``step``."""
    run.sync_weights()
    trajs = greedy_rollouts(run, rows)
    success = sum(t.total_reward > 0 for t in trajs) / max(1, len(trajs))
    run.log.metrics(step, "probe", {"probe_success": success, "probe_episodes": len(trajs)})
    return success


def rl_phase(run, plan: LevelPlan, deadline: float, evals: list[EvalResult], eval_seconds: float) -> int:
    """GRPO steps (``vlrl.train.loop.rl_step``: rollout, agreement check, update, verified sync) until
    ``deadline``, reserving one evaluation's time for the final one. Returns the steps taken."""
    from vlrl.train.loop import rl_step

    step, t0 = 0, time.time()
    while step < run.cfg.run.steps:
        per_step = (time.time() - t0) / max(1, step) if step else 0.0
        if time.time() + per_step + eval_seconds > deadline:
            break
        rl_step(run, step)
        step += 1
        if plan.eval_every and step % plan.eval_every == 0:
            evals.append(evaluate(run, step, "during"))
    return step


def start_weights(plan: LevelPlan, out: str | Path, model_path: str | Path | None) -> str | Path | None:
    """Where the level starts: ``model_path``, else the random-init model of the plan (``plan.model`` drawn by
    ``plan.init``) in the level's ``model.arch``; None (the config's named size) for ``tiny`` with the named
    sizes' init."""
    from vlrl.envs.maze_models import start_checkpoint

    if model_path is None and (
        (plan.model, plan.init, plan.image_stats) != ("tiny", "normal", "model") or plan.image_side
    ):
        arch = level_config(plan, out).model.arch
        return start_checkpoint(arch, plan.model, plan.init, image_side=plan.image_side, image_stats=plan.image_stats)
    return model_path


def train_level(plan: LevelPlan, out: str | Path, model_path: str | Path | None = None) -> LevelResult:
    """Train one level within its budgets; writes the run dir (metrics, agreement, samples, summary,
    report) and ``<out>/weights`` (after SFT, and again after RL); returns what it reached."""
    from vlrl.durable import write_atomic
    from vlrl.report.training import write_report
    from vlrl.train.run import Run

    t0 = time.time()
    cfg = level_config(plan, out, start_weights(plan, out, model_path))
    run = Run(cfg)
    try:
        run.log.reset()
        write_atomic(run.log.dir / "config.toml", cfg.to_toml())
        evals: list[EvalResult] = []
        if plan.eval_before:
            evals.append(evaluate(run, 0, "before"))
        sft_steps, episodes = sft_phase(run, t0 + plan.sft_seconds, plan) if cfg.sft.steps else (0, 0)
        t_sft = time.time()
        # saved before the eval too: a command's clock that cuts the eval (200 long episodes) keeps what SFT trained
        weights = save_weights(run, Path(out) / "weights")
        e0 = time.time()
        evals.append(evaluate(run, 0, "after_sft" if sft_steps else "start"))
        rl_steps = rl_phase(run, plan, t_sft + plan.rl_seconds, evals, time.time() - e0)
        if rl_steps:
            evals.append(evaluate(run, rl_steps, "after"))
            weights = save_weights(run, Path(out) / "weights")
        seconds = (round(t_sft - t0, 1), round(time.time() - t_sft, 1))
        row = _config_row(cfg) | _plan_row(plan, run)
        result = LevelResult(
            plan.level, str(out), sft_steps, episodes, rl_steps, *seconds, tuple(evals), str(weights), row
        )
        summary = {
            "name": cfg.name,
            "eval_before": evals[0].success if plan.eval_before else None,  # evals[0] is after SFT otherwise
            "eval_after": evals[-1].success,
            "steps": rl_steps,
            "sft_steps": sft_steps,
            "seconds": round(time.time() - t0, 1),
            "out": str(out),
            "level": result.row(),
        }
        run.log.write_json("summary.json", summary)
    finally:
        run.close()
    write_report(out)
    return result


def _plan_row(plan: LevelPlan, run) -> dict[str, Any]:
    """The plan's choices (beside the config's, :func:`_config_row`) for the success-vs-compute table; the model, its
    init and pixel statistics as the level's start checkpoint has them (a continued level was not drawn by the plan)."""
    from vlrl.envs.maze_models import checkpoint_choices

    built = checkpoint_choices(run.model_dir)
    as_planned = ("first_turns", "first_start", "mask_detours", "sft_pool", "sft_warmup_steps", "sft_until")
    return {
        "model": built["model"] or plan.model,
        "init": built["init"] or plan.init,
        "image_stats": built["image_stats"],
        "n_params": sum(p.numel() for p in run.model.parameters()),
        "sft_lr_scale": dict(plan.sft_lr_scale),
        "takeover": list(plan.takeover),
        "fork_mazes": list(plan.fork_mazes),
    } | {name: getattr(plan, name) for name in as_planned}


def _config_row(cfg) -> dict[str, Any]:
    return {
        "size": cfg.model.size if cfg.model.path is None else f"model.path {cfg.model.path}",
        "dtype": cfg.model.dtype,
        "device": cfg.model.device,
        "env": cfg.data.env,
        "extras": dict(cfg.data.extras),
        "eval_rows": cfg.data.eval_rows,
        "sft_lr": cfg.sft.lr,
        "sft_rows_per_step": cfg.sft.rows_per_step,
        "rl_lr": cfg.optim.lr,
        "rollout": f"{cfg.rollout.rows_per_step} rows x {cfg.rollout.repeats}",
        "agreement": cfg.run.agreement,
    }


def write_results(results: list[LevelResult], path: str | Path) -> None:
    Path(path).write_text(json.dumps([r.row() for r in results], indent=2) + "\n")
