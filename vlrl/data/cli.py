"""``vlrl dataset``: write ``train.parquet`` and ``eval.parquet`` of env rows for one env.

vlrl dataset --env maze2d/easy --train 256 --eval 64 --out data/maze_easy
vlrl dataset --env geometry --train 1000 --eval 100 --out data/geometry    # image prompts
vlrl dataset --env color_square --extras '{"n_turns": 3}' --images ...     # prompts carry images
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlrl.cli import count, env_usage, json_object

PROMPT_ENVS = ("geometry",)  # envs whose rows carry their prompt (and ground truth) by default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env", required=True, help="registered env class (maze2d/easy) or module:factory (rows carry that string)"
    )
    parser.add_argument("--train", type=count(0), default=256, help="train rows (default 256)")
    parser.add_argument("--eval", type=count(0), default=64, help="eval rows, seeds 0..N-1 (default 64)")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--extras", type=json_object, default={}, help="JSON object merged into every row's extras")
    parser.add_argument(
        "--train-seed",
        type=count(0),
        default=None,
        help="seed for drawing train seeds (default: fresh entropy, printed)",
    )
    images = parser.add_mutually_exclusive_group()
    images.add_argument(
        "--images",
        dest="with_prompts",
        action="store_true",
        default=None,
        help="store each row's first message (images as data URIs) as its prompt",
    )
    images.add_argument(
        "--tickets",
        dest="with_prompts",
        action="store_false",
        help="placeholder prompts; the env renders from the seed",
    )


def run(args: argparse.Namespace) -> int:
    import secrets

    from vlrl.data.rows import write_rows
    from vlrl.data.tickets import build_splits
    from vlrl.envs import make_env
    from vlrl.envs.gym_adapter import quiet_sdl
    from vlrl.envs.registry import resolve_env

    quiet_sdl()
    extras = args.extras
    with_prompts = args.env in PROMPT_ENVS if args.with_prompts is None else args.with_prompts
    train_seed = secrets.randbits(31) if args.train_seed is None else args.train_seed
    env_usage(f"--env {args.env}", lambda: resolve_env(args.env, "--env"))  # module:factory: imported here only
    env_usage(f"--env {args.env}", lambda: make_env(args.env, extras, 0).close())  # now, not at train time
    splits = build_splits(
        args.env, args.train, args.eval, extras=extras, with_prompts=with_prompts, train_seed=train_seed
    )
    for split, rows in splits.items():
        path = write_rows(rows, args.out / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {path}")
    print(f"train seeds drawn with --train-seed {train_seed}")
    return 0
