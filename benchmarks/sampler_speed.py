"""The engine's sampler (``vlrl.engines.sampling.sample_tokens``: rows drawn together) against one
``torch.multinomial`` per row (the sampler before 2026-11-26), per decode step at the real Qwen vocabulary: the
seconds of a step and whether both picked the same tokens from the same generators.

    python benchmarks/sampler_speed.py OUT.json [--device cuda] [--rows 64,256] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.bench.env import git_commit, host, versions
from vlrl.engines.sampling import sample_tokens, sample_tokens_per_row
from vlrl.engines.types import SamplingParams

VOCAB = 151936


def timed(fn, logits, params, banned, device, steps: int) -> tuple[float, list[list[int]]]:
    gens = [torch.Generator(device=device).manual_seed(p.seed) for p in params]
    picks = [fn(logits[k % 4], params, banned, gens).tolist() for k in range(2)]  # warm-up, kept for the comparison
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(steps):
        picks.append(fn(logits[k % 4], params, banned, gens).tolist())  # .tolist(): the engine reads them each step
    return (time.perf_counter() - t0) / steps, picks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    banned = torch.tensor([151652, 151653, 151654, 151655, 151656], device=args.device)
    result: dict = {"device": args.device, "vocab": VOCAB, "steps": args.steps, "commit": git_commit()}
    result |= {"host": host(), "versions": versions(), "by_rows": {}}
    if args.device.startswith("cuda"):
        result["device_name"] = torch.cuda.get_device_name()
    for n in [int(r) for r in args.rows.split(",")]:
        logits = torch.randn(4, n, VOCAB, generator=torch.Generator().manual_seed(n)).mul_(3).to(args.device)
        params = [SamplingParams(temperature=1.0, seed=i) for i in range(n)]
        batched_s, batched = timed(sample_tokens, logits, params, banned, args.device, args.steps)
        rows_s, rows = timed(sample_tokens_per_row, logits, params, banned, args.device, args.steps)
        result["by_rows"][str(n)] = {
            "batched_ms_per_step": round(batched_s * 1e3, 3),
            "per_row_ms_per_step": round(rows_s * 1e3, 3),
            "speedup": round(rows_s / batched_s, 2),
            "same_tokens": batched == rows,
        }
        print(n, json.dumps(result["by_rows"][str(n)]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
