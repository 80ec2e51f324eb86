"""Multi-turn rollouts on the embedded engine with and without its gathering wait (``gather_s``), alternating in
one process: per-turn and total seconds, and the batch sizes the engine formed. Concurrent episodes queue their
turns a few ms apart; without the wait the first of them started a batch alone and the rest waited for it.

    python benchmarks/engine_gather.py OUT.json [--size 2b --device cuda --dtype bfloat16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from vlrl.bench.env import device_name, git_commit, host, versions
from vlrl.bench.multiturn import rollout_turns
from vlrl.engines.embedded import EmbeddedEngine
from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.render.embedded import EmbeddedRenderer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--gather", default="0,0.01", help="gather_s values, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    path = cached_model_dir("qwen2_5_vl", args.size)
    model = load_model(path, dtype=getattr(torch, args.dtype), device=args.device)
    renderer = EmbeddedRenderer.from_pretrained(path)
    result: dict = {"config": vars(args), "device": device_name(args.device), "commit": git_commit()}
    result |= {"host": host(), "versions": versions(), "runs": []}
    for r in range(args.rounds):
        for gather in (float(g) for g in args.gather.split(",")):
            engine = EmbeddedEngine(model, renderer.tokenizer, gather_s=gather)  # fresh caches each run
            sizes: list[int] = []
            decode = engine._decode

            def counted(reqs, decode=decode, sizes=sizes):
                sizes.append(len(reqs))
                return decode(reqs)

            engine._decode = counted  # type: ignore[method-assign]
            t0 = time.perf_counter()
            turns, _ = rollout_turns(
                renderer, engine, episodes=args.episodes, turns=args.turns, max_tokens=args.max_tokens
            )
            run = {"round": r, "gather_s": gather, "seconds": round(time.perf_counter() - t0, 3), "batches": sizes}
            run |= {k: turns[k] for k in ("total_seconds", "last_over_first_turn")}
            run["turn_seconds"] = [t["seconds"] for t in turns["per_turn"]]
            result["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "batches"}), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
