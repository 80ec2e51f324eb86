"""What a fresh AdamW does to a trained maze policy in its first SFT steps, by warm-up length (CPU).

    python benchmarks/sft_restart.py --weights DIR [--level easy] [--rows 8] [--batches 4] [--steps 30] \
        [--warmups 1,10,30] [--lr 1e-3] [--heldout 32] [--every 5] [--first-turns] [--json out.json]

Why: lease_v2 (benchmarks/results/maze_curriculum_h100/lease_v2) continued an easy policy with a new AdamW whose
warm-up (10 s of the phase's clock) was over before the second step; the loss went 0.030 -> 0.323 and took ~120
steps to come back. Each variant here starts from the same weights with a new AdamW (the curriculum's: betas 0.9,
0.999, no weight decay), trains the same batches in the same order at ``--lr`` after a linear ramp of W steps (W=1:
the first step at lr 0, every later one at the peak, as that run did), and measures the cross-entropy of a fixed
held-out batch (expert episodes on the level's eval mazes) every ``--every`` steps. The ramp here starts at 0 so that
W=1 is that run's schedule; the curriculum's ramp now (``--sft-warmup-steps``, the trainer's ``warmup_factor``) is
the same one step ahead. ``--first-turns``: rows cut to their first turn (one image each; a step of 6 whole easy
episodes took ~20 s on 2 cores, held-out evals included). Writes the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_data import first_turn_row


def warm_factor(step: int, warmup: int) -> float:
    """The lr factor of optimizer step ``step`` (0-based) under a ramp of ``warmup`` steps: 0 at step 0, 1 from
    step ``warmup`` on."""
    return min(1.0, step / max(1, warmup))


def held_out_loss(model, batch) -> float:
    """Token-mean cross-entropy of ``batch``'s trained tokens (as ``Trainer.sft_step`` computes it), no update."""
    import torch

    from vlrl.train.forward import policy_forward

    with torch.no_grad():
        out = policy_forward(model, batch.replace(temperature=1.0), with_entropy=False)
        mask = batch.loss_mask
        return float(-(out.logprobs * mask).sum() / mask.sum().clamp(min=1))


def variant(run, start: dict, batches: list, held, warmup: int, args) -> dict:
    """One warm-up length from ``start``'s weights: the held-out loss at every ``args.every`` steps."""
    from vlrl.train.trainer import Trainer

    run.model.load_state_dict(start)
    optim = dataclasses.replace(run.cfg.optim, lr=args.lr, warmup_steps=0)
    trainer = Trainer(run.model, run.cfg.algo, optim)
    curve, train, t0 = [[0, held_out_loss(run.model, held)]], [], time.time()
    for k in range(args.steps):
        for group in trainer.optimizer.param_groups:
            group["lr"] = args.lr * warm_factor(k, warmup)
        train.append(round(trainer.sft_step(batches[k % len(batches)])["loss"], 5))
        if (k + 1) % args.every == 0:
            curve.append([k + 1, held_out_loss(run.model, held)])
            print(f"warmup {warmup}: step {k + 1} held-out {curve[-1][1]:.4f}", flush=True)
    worst = max(loss for _, loss in curve)
    return {
        "warmup_steps": warmup,
        "held_out": [[k, round(v, 5)] for k, v in curve],
        "worst_over_start": round(worst / curve[0][1], 3),
        "end_over_start": round(curve[-1][1] / curve[0][1], 3),
        "train_loss": train,
        "seconds": round(time.time() - t0, 1),
    }


def parser() -> argparse.ArgumentParser:
    """The command line (the weights, the level, the batches and the warm-up lengths to compare)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", required=True, help="a trained policy's directory (e.g. unpacked lease parts)")
    ap.add_argument("--level", default="easy")
    ap.add_argument("--rows", type=int, default=8, help="episodes a step")
    ap.add_argument("--batches", type=int, default=4, help="distinct training batches, cycled")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmups", default="1,10,30", help="ramp lengths in optimizer steps (1: none)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--heldout", type=int, default=32, help="held-out episodes (the eval split's first)")
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--first-turns", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="")
    return ap


def _batches(run, args: argparse.Namespace) -> tuple[list, Any]:
    """``--batches`` training batches of ``--rows`` expert episodes each (the run's next training rows) and the
    held-out batch (expert episodes on the eval split's first ``--heldout`` rows); first turns only with
    ``--first-turns``."""
    from vlrl.envs.maze_sft_data import expert_episodes
    from vlrl.train.loop import require_batch

    cut = first_turn_row if args.first_turns else (lambda row: row)
    batches = [
        require_batch(run, expert_episodes(run, [cut(r) for r in run.next_rows(args.rows)], i, masked=True), "b")
        for i in range(args.batches)
    ]
    held = require_batch(
        run, expert_episodes(run, [cut(r) for r in run.eval_rows[: args.heldout]], 99, masked=True), "held"
    )
    return batches, held


def main() -> None:
    args = parser().parse_args()

    import torch

    from vlrl.train.run import Run

    if args.threads:
        torch.set_num_threads(args.threads)
    extras = 'data.extras={"expert_noise":0.15,"expert_branch":0.15}'
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sets = (extras, f"model.device={device}", f"optim.micro_batch_size={args.rows}", f"data.eval_rows={args.heldout}")
    plan = LevelPlan(args.level, 0, 0, overrides=sets)
    run = Run(level_config(plan, "/tmp/sft_restart", args.weights))
    try:
        t = time.time()
        batches, held = _batches(run, args)
        built = time.time() - t
        start = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        rows = [variant(run, start, batches, held, int(w), args) for w in args.warmups.split(",")]
    finally:
        run.close()
    result = {
        "weights": args.weights,
        "level": args.level,
        "first_turns": args.first_turns,
        "rows_per_step": args.rows,
        "batches": args.batches,
        "heldout_episodes": args.heldout,
        "heldout_tokens": int(held.loss_mask.sum()),
        "lr": args.lr,
        "build_s": round(built, 1),
        "threads": torch.get_num_threads(),
        "variants": rows,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}))
    for r in rows:
        print(r["warmup_steps"], r["held_out"], r["worst_over_start"], r["end_over_start"], r["seconds"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
