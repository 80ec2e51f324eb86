"""GRPO from a partly trained SFT policy, by RL learning rate and lr warm-up (CPU, color_square, tiny).

    python benchmarks/rl_after_sft.py [--out /tmp/rl_after_sft] [--json benchmarks/results/rl_after_sft_cpu.json]

Each run is ``vlrl train color_square`` with the real expert's SFT cut short (``sft.steps=35``: greedy eval
0.86 of 64, so there is room above it) and then GRPO (8 rows x 8) with greedy eval after every RL step, for
each ``optim.lr`` x ``optim.warmup_steps`` of the grid. The question it answers: when GRPO after SFT lowers the
greedy policy (the maze curriculum's 7x7 runs on the H100), is it the fresh AdamW's first steps (which
``optim.warmup_steps`` ramps) or the RL learning rate itself? Writes the eval and sampled-reward curves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

GRID = (("3e-4", 0), ("3e-4", 5), ("1e-3", 0), ("1e-3", 5), ("3e-3", 0), ("3e-3", 5), ("3e-3", 20))
COMMON = (
    "sft.steps=35",
    "run.steps=10",
    "run.eval_every=1",
    "rollout.rows_per_step=8",
    "rollout.repeats=8",
    "run.progress=False",
)


def one_run(out: Path, lr: str, warmup: int) -> dict:
    """Train one grid point; its eval curve (after SFT, then after each RL step) and RL step stats."""
    args = ["train", "color_square", *COMMON, f"optim.lr={lr}", f"optim.warmup_steps={warmup}", f"run.out={out}"]
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "vlrl.cli", *args], check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_reward_mean"] for r in rows if r["phase"] == "eval" and r.get("label") != "before"]
    rl = [r for r in rows if r["phase"] == "rl"]
    return {
        "lr": float(lr),
        "warmup_steps": warmup,
        "command": "vlrl " + " ".join(args[:-1]),
        "eval_after_sft": evals[0],
        "eval_by_rl_step": evals[1:],
        "sampled_reward": [round(r["reward_mean"], 4) for r in rl],
        "response_len": [round(r["response_len"], 3) for r in rl],
        "seconds": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/rl_after_sft")
    ap.add_argument("--json", default="benchmarks/results/rl_after_sft_cpu.json")
    args = ap.parse_args(argv)
    runs = []
    for lr, warmup in GRID:
        runs.append(one_run(Path(args.out) / f"lr{lr}_w{warmup}", lr, warmup))
        r = runs[-1]
        print(f"lr {lr} warmup {warmup}: {r['eval_after_sft']:.2f} -> {[round(e, 2) for e in r['eval_by_rl_step']]}")
    Path(args.json).write_text(json.dumps({"eval_episodes": 64, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
