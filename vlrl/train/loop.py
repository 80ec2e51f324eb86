"""The training loop, on one screen: SFT warm start (optional), then RL steps.

Each RL step: rollout → trainer logprobs (checked against the rollout's) → reference logprobs
and advantages → epochs × mini-batches of updates → weight sync (verified) → metrics → seeded
evaluation every N steps → checkpoint. A run resumed from a checkpoint (``run.resume``) continues
exactly where it was saved — in SFT or RL — with its logs trimmed to that instant; a fresh run in a
directory replaces what an earlier run left there.

The same loop runs on every rank of a ``torchrun`` launch: ``Run`` hides where things happen (rollouts and
evaluation on rank 0, logprobs and updates on every rank's share of the batch; see ``vlrl.train.run``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import torch

from vlrl.durable import write_atomic
from vlrl.errors import VlrlError
from vlrl.rollout.scripted import refuse_cut
from vlrl.train import distributed as D
from vlrl.train.config import TrainConfig
from vlrl.train.experts import expert_for
from vlrl.train.master import round_masters_
from vlrl.train.progress import Progress
from vlrl.train.run import Run
from vlrl.train.trainer import Trainer


class NothingToTrainError(VlrlError):
    """A step whose rollout generated no token to train on (every episode failed or had no room)."""


def train(cfg: TrainConfig, on_start: Callable | None = None) -> dict:
    """Run ``cfg`` to the end; returns the summary (also written to ``<run>/summary.json``; under torchrun
    rank 0's, on every rank).

    ``on_start(model)`` is called once the policy model is built (tests snapshot its weights).
    """
    t0 = time.time()
    run = Run(cfg)
    progress = Progress({"sft": cfg.sft.steps, "rl": cfg.run.steps}, enabled=cfg.run.progress and run.dist.is_main)
    finished = False
    if on_start is not None:
        on_start(run.model)
    try:
        if not (cfg.run.resume and run.resume(cfg.run.resume)):
            run.log.reset()
        if run.dist.is_main:
            write_atomic(run.log.dir / "config.toml", cfg.to_toml())
        state = run.state
        if state.eval_before is None and state.rl_step == state.sft_step == 0:
            state.eval_before = evaluate(run, progress, 0, "before")
        if state.sft_step < cfg.sft.steps:
            sft(run, progress)
        every, stop = cfg.run.checkpoint_every, False
        progress.begin("rl", state.rl_step)
        for step in range(state.rl_step, cfg.run.steps):
            rl_step(run, step, progress)
            done = step + 1
            if cfg.run.eval_every and done % cfg.run.eval_every == 0 and done < cfg.run.steps:
                stop = reached(cfg, evaluate(run, progress, done, "during"))
            if every and done % every == 0:
                run.save()
            if stop:
                break
        sizes = run.log.sizes()  # a resume from the last checkpoint redoes the final evaluation
        progress.close()  # a run stopped early (run.stop_at) leaves its RL bar short
        after = evaluate(run, progress, state.rl_step, "after")
        if cfg.run.image_probe:
            run.probe_images(state.rl_step, "after")
        run.save(log_sizes=sizes)
        summary = {
            "name": cfg.name,
            "eval_before": state.eval_before,
            "eval_after": after,
            "steps": state.rl_step,
            "sft_steps": cfg.sft.steps,
            "seconds": round(time.time() - t0, 1),
            "out": str(run.log.dir),
        }
        run.log.write_json("summary.json", summary)
        summary = D.broadcast(summary)
        finished = True
        return summary
    finally:
        progress.close()
        run.close(finished)


def evaluate(run: Run, progress: Progress | None, step: int, label: str) -> float | None:
    """:meth:`Run.evaluate`, with its line on the console."""
    t = time.perf_counter()
    mean = run.evaluate(step, label)
    if progress is not None:
        progress.eval(label, step, mean, len(run.eval_rows), time.perf_counter() - t)
    return mean


def reached(cfg: TrainConfig, reward: float | None) -> bool:
    """Whether an evaluation's mean reward (rank 0's; None elsewhere) met ``run.stop_at``, on every rank."""
    return cfg.run.stop_at is not None and bool(D.broadcast(reward is not None and reward >= cfg.run.stop_at))


def rl_step(run: Run, step: int, progress: Progress | None = None) -> dict:
    cfg = run.cfg
    clock = [time.perf_counter()]  # the step's time split: rollout, train (logprobs, checks, update), sync
    trajs = run.rollout(run.next_rows(cfg.rollout.rows_per_step), seed=cfg.run.seed * 1_000_003 + step)
    clock.append(time.perf_counter())
    batch = require_batch(run, trajs, f"RL step {step + 1}")
    rewards = [t.total_reward for t in trajs]
    values = {
        "reward_mean": sum(rewards) / len(rewards),
        "response_len": sum(sum(t.loss_mask) for t in trajs) / len(trajs),
    }
    old = run.logprobs(batch, probe=batch.engine_topk is not None)  # + the full-distribution check
    agree = run.agreement(step + 1, batch, old)
    inputs, correction = run.trainer.prepare(batch, old)
    values |= run.update(batch, inputs, seed=cfg.run.seed * 7_919 + step) | correction
    values |= {"logprob_max_abs_diff": agree["max_abs"]}
    clock.append(time.perf_counter())
    run.sync_weights()
    clock.append(time.perf_counter())
    values |= {f"time_{k}_s": round(b - a, 3) for k, a, b in zip(("rollout", "train", "sync"), clock, clock[1:])}
    run.state.rl_step = step + 1
    row = run.log.metrics(step + 1, "rl", values)
    if progress is not None:
        tokens = sum(len(t.loss_mask) for t in trajs)  # the response tokens of the step's episodes
        progress.step("rl", step + 1, row | {"agreement_bound": agree.get("bound")}, tokens=tokens)
    return row


def sft(run: Run, progress: Progress | None = None) -> None:
    """Cross-entropy steps on expert episodes (their own optimizer), then the engine gets the weights.
    With ``run.checkpoint_every`` > 0: a checkpoint every N SFT steps (SFT optimizer included) and one at
    the end of SFT."""
    cfg = run.cfg
    expert = expert_for(cfg.sft.expert or cfg.data.env.split("/")[0])
    sft_trainer = Trainer(run.model, cfg.algo, cfg.optim, lr=cfg.sft.lr)
    if run.restore_sft_optimizer is not None:
        run.restore_sft_optimizer(sft_trainer.optimizer)
        run.restore_sft_optimizer = None
    every = cfg.run.checkpoint_every
    if progress is not None:
        progress.begin("sft", run.state.sft_step)
    for k in range(run.state.sft_step, cfg.sft.steps):
        trajs = run.rollout(run.next_rows(cfg.sft.rows_per_step), seed=k, repeats=1, script=expert)
        refuse_cut(trajs, f"SFT step {k + 1}'s expert episodes")
        values = run.sft_update(sft_trainer, require_batch(run, trajs, f"SFT step {k + 1}"))
        run.state.sft_step = k + 1
        run.log.metrics(k + 1, "sft", values)
        if progress is not None:
            reward = sum(t.total_reward for t in trajs) / len(trajs)  # the expert's, not the policy's
            progress.step("sft", k + 1, values | {"reward_mean": reward}, tokens=sum(len(t.loss_mask) for t in trajs))
        if every and (k + 1) % every == 0 and k + 1 < cfg.sft.steps:
            run.save(optimizer=sft_trainer.optimizer)
    if run.dist.sharded and cfg.optim.master_weights == "float32" and run.dtype != torch.float32 and not cfg.model.lora:
        # The SFT optimizer's masters end with it: RL starts from the weights in the run's dtype, as a plain run's
        # fresh RL optimizer starts its masters from its bf16 parameters (tests/train/test_fsdp_one_rank.py). Not
        # with LoRA: there only the adapters train, and peft keeps them fp32 parameters in a plain run too.
        round_masters_(run.model, run.dtype)
    run.sync_weights()
    evaluate(run, progress, 0, "after_sft")
    if cfg.run.image_probe:
        run.probe_images(0, "after_sft")
    if every:
        run.save()


class Collates(Protocol):
    """What :func:`require_batch` needs of a run (a :class:`Run`, or an SFT farm's worker)."""

    def collate(self, trajectories: list) -> Any: ...


def require_batch(run: Collates, trajs: list, what: str):
    """The step's batch, or :class:`NothingToTrainError` saying why no episode generated a token."""
    batch = run.collate(trajs)
    if batch is None:
        reasons = dict(Counter(t.stop_reason for t in trajs))
        error = next((t.error for t in trajs if t.error), None)
        raise NothingToTrainError(
            f"{what}: none of the {len(trajs)} episodes generated a token to train on "
            f"(stop reasons {reasons}" + (f"; first error: {error})" if error else ")")
        )
    return batch
