"""``vlrl rollout``: roll out env episodes through a checkpoint and write the trajectories as JSONL.

    vlrl rollout --env maze2d/easy --rows 4 --repeats 2 --max-tokens 32 --out rollouts.jsonl
    vlrl rollout --env gym/Acrobot-v1 --extras '{"keywords": {"left": 0, "none": 1, "right": 2}}'
    vlrl rollout --data data/eval.parquet --model DIR --mode step --out rollouts.jsonl

Arguments, the env and its extras are checked before the model loads.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from vlrl.cli import count, env_usage, json_object, non_negative_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        default="color_square",
        help="env class for ticket rows: a registered name or module:factory (with --data: imported, so rows "
        "whose env_class is that module:factory can be made)",
    )
    parser.add_argument(
        "--extras",
        type=json_object,
        default={},
        help="JSON object: every ticket row's extras, as in `vlrl dataset` (ignored with --data)",
    )
    parser.add_argument("--rows", type=count(1), default=4, help="how many ticket rows (seeds 0..N-1)")
    parser.add_argument("--data", help="a dataset parquet written by `vlrl dataset` instead of --env/--rows")
    parser.add_argument("--model", help="checkpoint dir (default: the tiny checkpoint of --arch, built if missing)")
    parser.add_argument(
        "--arch",
        default="qwen2_5_vl",
        choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"),
        help="tiny architecture when --model is not given",
    )
    parser.add_argument("--repeats", type=count(1), default=1, help="episodes per row")
    parser.add_argument("--max-turns", type=count(1), default=None, help="turn budget (default: the env's)")
    parser.add_argument("--max-tokens", type=count(1), default=64, help="tokens per reply")
    parser.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--mode", choices=("multi_turn", "step"), default="multi_turn")
    parser.add_argument("--seed", type=count(0), default=0, help="base sampling seed")
    parser.add_argument("--out", default="rollouts.jsonl", help="output JSONL path")


def rows_of(args: argparse.Namespace) -> list:
    """The rows to roll out; the env is made once here, so an unknown env or bad extras fail before the model loads."""
    from vlrl.data.rows import read_rows
    from vlrl.data.tickets import make_rows
    from vlrl.envs import make_env
    from vlrl.envs.registry import resolve_env

    env_usage(f"--env {args.env}", lambda: resolve_env(args.env, "--env"))  # module:factory: imported here only
    if args.data:
        if not Path(args.data).is_file():
            raise FileNotFoundError(f"--data {args.data}: no such file")
        return read_rows(args.data)
    env_usage(f"--env {args.env}", lambda: make_env(args.env, args.extras, 0).close())
    return make_rows(args.env, list(range(args.rows)), args.extras)


def run(args: argparse.Namespace) -> int:
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.envs.gym_adapter import quiet_sdl
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.rollout.generator import RolloutConfig, RolloutGenerator
    from vlrl.rollout.io import write_jsonl

    quiet_sdl()
    rows = rows_of(args)
    sampling = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, stop=tuple(args.stop))
    config = RolloutConfig(
        sampling=sampling, repeats=args.repeats, max_turns=args.max_turns, mode=args.mode, seed=args.seed
    )
    path = args.model or cached_model_dir(args.arch, "tiny")
    renderer, engine = EmbeddedRenderer.from_pretrained(path), EmbeddedEngine.from_pretrained(path)
    trajectories = RolloutGenerator(renderer, engine, config).run(rows)
    out = write_jsonl(trajectories, args.out, renderer.tokenizer)
    print(
        json.dumps(
            {
                "trajectories": len(trajectories),
                "out": str(out),
                "stop_reasons": dict(Counter(t.stop_reason for t in trajectories)),
                "mean_return": sum(t.total_reward for t in trajectories) / max(1, len(trajectories)),
            }
        )
    )
    return 0
