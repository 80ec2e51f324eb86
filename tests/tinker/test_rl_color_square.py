"""RL through the Tinker API: the cookbook-style loop (tests/tinker/rl_loop.py, SDK calls only, importance_sampling)
takes color_square from the format-only warm start to eval >= 0.9 — the learning of ``vlrl train`` with recipe
vlrl/recipes/color_square_rl.toml (8 rows x 8 repeats, lr 3e-3, embedding lr x0.1), through the wire.

Measured (2 shared CPU cores): warm start 0.23; the loop retraces ``vlrl train``'s own run from the same warm start
(one API step is one ``Trainer`` step, tests/tinker/test_same_update.py). At 0f66adb, alone (``-n 0``): eval 0.19 /
0.33 / 0.56 / 0.33 / 0.48 / 0.67 / 0.97 at steps 10-70, stopping at 70 in 7.0 min (another process shared the
cores) -- the curve the recipe header records for ``vlrl train`` at 79a6f80. In CI (two workers) it stopped at 80,
7.5-8.5 min: the suite's longest test. (At its first measurement it had stopped at 40, in 3 min.) With sampling seeds
of its own (one request of 8 samples per row) four runs stopped at 0.58-0.81 by step 60 -- the recipe header records
the same spread across seeds for ``vlrl train``.

Runs differ in the last bits: the engine's prefix-KV reuse and which concurrent requests share a batch move
sampled logprobs by ~1e-6, and a sampled token flips 21-28 steps in, so each run is in effect its own seed (with
the prefix cache off and one request at a time, two runs were bit-identical). Every full run measured broke its
format for a step or two between steps 32 and 65 (22-34 % of the replies not a colour word) and recovered; one CI
run broke it for good at step 70 (eval 0.0, no group with a reward left to learn from). Evaluating every 5 steps
instead of 10 stops a run nearer the step that reached the bar. Measured with ``benchmarks/tinker_rl_study.py``
(``benchmarks/results/tinker_rl_study/``).
"""

from __future__ import annotations

import pytest
from rl_loop import LoopConfig, rl_loop

RECIPE = "color_square_rl"
WARM_START_MAX = 0.35


@pytest.mark.train
def test_cookbook_rl_loop_learns_color_square_through_the_api(color_square_warm_start, record_property):
    import tinker

    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.tinker.server import build_service, serve_in_thread
    from vlrl.tinker.service import ServiceConfig
    from vlrl.train.config import load_config

    model_dir, _ = color_square_warm_start  # tests/conftest.py: the same one tests/train starts from
    cfg = load_config(RECIPE, [])  # the recipe's RL settings (the warm start ran with run.steps=0)
    service = build_service(
        ServiceConfig(
            base_model=str(model_dir),
            model_name="warm",
            lr_scale=dict(cfg.optim.lr_scale),
            micro_batch_size=cfg.optim.micro_batch_size,
        )
    )
    running = serve_in_thread(service)
    client = tinker.ServiceClient(base_url=running.url, api_key=running.api_key)
    try:
        loop = LoopConfig(
            model_name="warm",
            env=cfg.data.env,
            extras=dict(cfg.data.extras),
            train_rows=cfg.data.train_rows,
            eval_rows=cfg.data.eval_rows,
            seed=cfg.run.seed,
            rows_per_step=cfg.rollout.rows_per_step,
            repeats=cfg.rollout.repeats,
            max_tokens=cfg.rollout.max_tokens,
            temperature=cfg.rollout.temperature,
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            grad_clip=cfg.optim.grad_clip,
            steps=cfg.run.steps,
            eval_every=5,  # stops at the first eval >= 0.9: fewer steps spent where a run can break its format
            stop_at=0.9,
        )
        history = rl_loop(client, EmbeddedRenderer.from_pretrained(model_dir), loop, log=print)
    finally:
        client.close("success").result(timeout=30)  # ends its session's heartbeats before the server goes
        running.stop()
    record_property("tinker_rl_history", history)
    assert history[0]["eval"] <= WARM_START_MAX, f"the warm start must not know the colours: {history[0]}"
    assert history[-1]["eval"] >= 0.9, history
    assert all(h["data"] > 0 for h in history[1:]), "every step trained on some group"
