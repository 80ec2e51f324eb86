"""A maze SFT farm worker's resident memory, batch after batch (vlrl.envs.maze_sft_farm).

Why: a process that trains a whole device lease (benchmarks/device/lease.sh) keeps its SFT builders for ~1,000 s at a
level, twice as long as any run before. Here (CPU, tiny model) a worker that only dropped its renderer's caches
between batches grew without end. Each way runs in a fresh process (the farm's own worker start, then its
``_build`` on fresh training mazes, batch after batch, as a worker does), recording the resident set after each:

- ``forget``: what a worker did before: the renderer's caches dropped between batches;
- ``release``: what it does now (``maze_sft_farm._release``): the decoded-image cache dropped too, and glibc's
  ``malloc_trim`` only once the worker is ``TRIM_ABOVE`` over where its first batch left it;
- ``trim_each``: ``release`` with ``malloc_trim`` after every batch.

    python benchmarks/farm_worker_memory.py --level 7x7 --rows 8 --batches 90

Appends a record to benchmarks/results/farm_worker_memory_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results" / "farm_worker_memory_cpu.json"
WAYS = ("forget", "release", "trim_each")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_way(way: str, level: str, rows: int, batches: int) -> dict:
    """In this process: a worker's start and ``batches`` builds of ``rows`` fresh mazes each, released ``way``."""
    import dataclasses

    from vlrl.envs import maze_sft_farm as farm
    from vlrl.envs.maze_curriculum import LevelPlan, level_config
    from vlrl.train.run import Run

    sets = ("model.device=cpu", f"sft.rows_per_step={rows}", "data.train_rows=100000", "data.extras.expert_branch=0.15")
    out = tempfile.mkdtemp(prefix="farm-mem-")
    run = Run(level_config(LevelPlan(level, 600, 0, overrides=sets), out))
    config = dataclasses.replace(run.rollout_config(0, repeats=1), max_context=run.engine.max_context, progress=False)
    farm._start(str(run.model_dir), run.spec, out)
    if way == "forget":
        farm._release = lambda: farm._WORKER["renderer"].forget()  # the worker before
    elif way == "trim_each":
        farm.TRIM_ABOVE = -(2**62)  # the heap trimmed after every batch
    start, rss, seconds = rss_mb(), [], []
    for i in range(batches):
        t = time.time()
        path = farm._build(run.next_rows(rows), config, i, True, "expert SFT batch", os.path.join(out, "b.pt"), None)
        os.unlink(path)
        seconds.append(round(time.time() - t, 2))
        rss.append(round(rss_mb()))
    run.close()
    return {"way": way, "rss_start_mb": round(start), "rss_mb": rss, "batch_s": seconds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", default="7x7")
    ap.add_argument("--rows", type=int, default=8, help="episodes a batch")
    ap.add_argument("--batches", type=int, default=90)
    ap.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # one way, in this process (the child)
    args = ap.parse_args(argv)
    if args.way:
        print(json.dumps(one_way(args.way, args.level, args.rows, args.batches)), flush=True)
        return 0
    runs = []
    for way in WAYS:
        cmd = [sys.executable, __file__, "--way", way, "--level", args.level, "--rows", str(args.rows)]
        done = subprocess.run([*cmd, "--batches", str(args.batches)], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        start, end = runs[-1]["rss_start_mb"], runs[-1]["rss_mb"][-1]
        print(f"{way}: {start} MB at the start, {end} MB after {args.batches} batches", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"commit": commit, "date": time.strftime("%Y-%m-%d"), "level": args.level, "rows": args.rows}
    record |= {"batches": args.batches, "threads": 1, "runs": runs}
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    RESULTS.write_text(json.dumps([*old, record], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
