"""The training loop, on one screen: SFT warm start (optional), then RL steps.

Each RL step: rollout → trainer logprobs (checked against the rollout's) → reference logprobs
and advantages → epochs × mini-batches of updates → weight sync (verified) → metrics → seeded
evaluation every N steps → checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vlrl.train.config import TrainConfig
from vlrl.train.experts import expert_for
from vlrl.train.run import Run
from vlrl.train.trainer import Trainer


def train(cfg: TrainConfig, on_start: Callable | None = None) -> dict:
    """Run ``cfg`` to the end; returns the summary (also written to ``<run>/summary.json``).

    ``on_start(model)`` is called once the policy model is built (tests snapshot its weights).
    """
    t0 = time.time()
    run = Run(cfg)
    if on_start is not None:
        on_start(run.model)
    try:
        (run.log.dir / "config.toml").write_text(cfg.to_toml())
        if cfg.run.resume:
            run.resume(cfg.run.resume)
        before = run.evaluate(0, "before") if run.state.rl_step == run.state.sft_step == 0 else None
        if run.state.sft_step < cfg.sft.steps:
            sft(run)
        for step in range(run.state.rl_step, cfg.run.steps):
            rl_step(run, step)
            done = step + 1
            if cfg.run.eval_every and done % cfg.run.eval_every == 0 and done < cfg.run.steps:
                run.evaluate(done, "during")
            if cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0:
                run.save()
        after = run.evaluate(cfg.run.steps, "after")
        if cfg.run.image_probe:
            run.probe_images(cfg.run.steps, "after")
        run.save()
        summary = {"name": cfg.name, "eval_before": before, "eval_after": after, "steps": cfg.run.steps,
                   "sft_steps": cfg.sft.steps, "seconds": round(time.time() - t0, 1), "out": str(run.log.dir)}
        run.log.write_json("summary.json", summary)
        return summary
    finally:
        run.close()


def rl_step(run: Run, step: int) -> dict:
    cfg = run.cfg
    trajs = run.rollout(run.next_rows(cfg.rollout.rows_per_step), seed=cfg.run.seed * 1_000_003 + step)
    batch = run.collate(trajs)
    rewards = [t.total_reward for t in trajs]
    values = {"reward_mean": sum(rewards) / len(rewards),
              "response_len": sum(sum(t.loss_mask) for t in trajs) / len(trajs)}
    if batch is not None:
        old = run.trainer.logprobs(batch, probe=batch.engine_topk is not None)  # + the full-distribution check
        agree = run.agreement(step + 1, batch, old)
        inputs, correction = run.trainer.prepare(batch, old)
        values |= run.trainer.rl_step(batch, inputs, seed=cfg.run.seed * 7_919 + step) | correction
        values |= {"logprob_max_abs_diff": agree["max_abs"]}
        run.sync_weights()
    run.state.rl_step = step + 1
    return run.log.metrics(step + 1, "rl", values)


def sft(run: Run) -> None:
    """Cross-entropy steps on expert episodes (their own optimizer), then the engine gets the weights."""
    cfg = run.cfg
    expert = expert_for(cfg.sft.expert or cfg.data.env.split("/")[0])
    sft_trainer = Trainer(run.model, cfg.algo, cfg.optim, lr=cfg.sft.lr)
    for k in range(run.state.sft_step, cfg.sft.steps):
        trajs = run.rollout(run.next_rows(cfg.sft.rows_per_step), seed=k, repeats=1, script=expert)
        values = sft_trainer.sft_step(run.collate(trajs))
        run.state.sft_step = k + 1
        run.log.metrics(k + 1, "sft", values)
    run.sync_weights()
    run.evaluate(0, "after_sft")
    if cfg.run.image_probe:
        run.probe_images(0, "after_sft")
