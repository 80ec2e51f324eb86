"""``vlrl rollout``: roll out env episodes through a checkpoint and write the trajectories as JSONL.

    vlrl rollout --env maze2d/easy --rows 4 --repeats 2 --max-tokens 32 --out rollouts.jsonl
    vlrl rollout --data data/eval.parquet --model DIR --mode step --out rollouts.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import Counter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="color_square", help="env class for ticket rows (ignored with --data)")
    parser.add_argument("--rows", type=int, default=4, help="how many ticket rows (seeds 0..N-1)")
    parser.add_argument("--data", help="a dataset parquet written by `vlrl dataset` instead of --env/--rows")
    parser.add_argument("--model", help="checkpoint dir (default: the tiny checkpoint of --arch, built if missing)")
    parser.add_argument("--arch", default="qwen2_5_vl", help="tiny architecture when --model is not given")
    parser.add_argument("--repeats", type=int, default=1, help="episodes per row")
    parser.add_argument("--max-turns", type=int, default=None, help="turn budget (default: the env's)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--mode", choices=("multi_turn", "step"), default="multi_turn")
    parser.add_argument("--seed", type=int, default=0, help="base sampling seed")
    parser.add_argument("--out", default="rollouts.jsonl", help="output JSONL path")


def run(args: argparse.Namespace) -> int:
    from vlrl.data.rows import read_rows
    from vlrl.data.tickets import make_rows
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
    from vlrl.rollout.io import write_jsonl

    path = args.model or cached_model_dir(args.arch, "tiny")
    renderer, engine = EmbeddedRenderer.from_pretrained(path), EmbeddedEngine.from_pretrained(path)
    rows = read_rows(args.data) if args.data else make_rows(args.env, list(range(args.rows)))
    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, stop=tuple(args.stop))
    config = RolloutConfig(sampling=sampling, repeats=args.repeats, max_turns=args.max_turns, mode=args.mode,
                           seed=args.seed)
    trajectories = RolloutGenerator(renderer, engine, config).run(rows)
    out = write_jsonl(trajectories, args.out, renderer.tokenizer)
    print(json.dumps({"trajectories": len(trajectories), "out": str(out),
                      "stop_reasons": dict(Counter(t.stop_reason for t in trajectories)),
                      "mean_return": sum(t.total_reward for t in trajectories) / max(1, len(trajectories))}))
    return 0
