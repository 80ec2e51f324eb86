"""What the rollout path spends rendering a batch of maze expert episodes (``vlrl.envs.maze_sft_data``): every
turn re-renders the conversation so far, as a policy's rollout does. (Expert episodes themselves are rendered
once since 4bcf105, ``vlrl.rollout.scripted_once``; this measures the per-turn path, ``scripts="per_turn"``.)
Times one batch of ``--rows`` episodes of a level with the decoded-image cache of ``vlrl.messages`` off (a zero
budget) and on, each on its own fresh mazes after a warm-up batch, and counts the data URIs decoded; the mazes
differ, so compare per turn. The tiny model on the CPU (rendering is CPU work on any host). ``--pixel-runs N`` then
times N rounds of the renderer joining a conversation's pixel rows with ``torch.cat`` of every image each turn (as
before ``vlrl.render.pixel_runs``) and with ``PixelRuns``, in turn.

    python benchmarks/expert_render.py OUT.json [--level easy] [--rows 8] [--pixel-runs 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import vlrl.messages as M
from vlrl.bench.env import git_commit, host, versions
from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_data import expert_episodes
from vlrl.lru import LruBytes
from vlrl.render.pixel_runs import PixelRuns
from vlrl.train.run import Run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--level", default="easy")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--pixel-runs", type=int, default=0, help="rounds of torch.cat against PixelRuns")
    args = ap.parse_args()
    overrides = ("model.device=cpu", f"sft.rows_per_step={args.rows}")
    run = Run(level_config(LevelPlan(args.level, 1, 0, overrides=overrides), "/tmp/expert_render"))
    rollout_config = run.rollout_config  # the per-turn render path, which policy rollouts take
    run.rollout_config = lambda *a, **k: dataclasses.replace(rollout_config(*a, **k), scripts="per_turn")  # type: ignore[method-assign]
    real, decoded = M.decode_data_uri, [0]

    def counting(*a, **k):
        decoded[0] += 1
        return real(*a, **k)

    M.decode_data_uri = counting
    result: dict = {"level": args.level, "rows": args.rows, "commit": git_commit(), "host": host()}
    result["versions"] = versions()
    try:
        expert_episodes(run, run.next_rows(args.rows), 0, masked=True)  # warm-up: imports, the processor
        for name, budget in (("cache_off", 0), ("cache_on", 256 * 2**20)):
            M._DECODED = LruBytes(budget)
            decoded[0] = 0
            t0 = time.perf_counter()
            trajs = expert_episodes(run, run.next_rows(args.rows), 1, masked=True)
            seconds = time.perf_counter() - t0
            turns = sum(len(t.turns) for t in trajs)
            result[name] = {
                "seconds": round(seconds, 3),
                "turns": turns,
                "ms_per_turn": round(seconds / turns * 1e3, 2),
            }
            result[name]["uris_decoded"] = decoded[0]
            print(name, json.dumps(result[name]), flush=True)
        if args.pixel_runs:
            result["pixel_runs"] = pixel_runs_rounds(run, args.rows, args.pixel_runs)
            print("pixel_runs", json.dumps(result["pixel_runs"]["median_ms_per_turn"]), flush=True)
    finally:
        run.close()
    Path(args.out).write_text(json.dumps(result, indent=1))


class CatAll:
    """The joining before PixelRuns: every image's rows copied again every turn."""

    def concat(self, keys, parts):
        import torch

        return torch.cat(list(parts))


def pixel_runs_rounds(run: Run, rows: int, rounds: int) -> dict:
    """ms a turn of one batch of expert episodes per round, the two joinings in turn (fresh mazes each)."""
    renderer, out = run.renderer, {"cat": [], "runs": []}
    for r in range(rounds):
        for name, joiner in (("cat", CatAll()), ("runs", PixelRuns())):
            renderer._runs = joiner
            t0 = time.perf_counter()
            trajs = expert_episodes(run, run.next_rows(rows), 100 + r, masked=True)
            seconds = time.perf_counter() - t0
            out[name].append(round(seconds / sum(len(t.turns) for t in trajs) * 1e3, 2))
    medians = {name: statistics.median(v) for name, v in out.items()}
    ratio = round(medians["cat"] / medians["runs"], 3)
    return {"ms_per_turn": out, "median_ms_per_turn": medians, "cat_over_runs": ratio}


if __name__ == "__main__":
    main()
