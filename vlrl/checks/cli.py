"""``vlrl check-env TARGET``: run the env conformance suite from the command line.

TARGET is ``module:factory`` (``factory(seed) -> Env``; importing the module may also register
envs) or a registered env name such as ``maze2d/easy``; ``--all`` checks every registered env.
Exit status 0 when everything passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from vlrl.cli import count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "targets", nargs="*", metavar="TARGET", help="module:factory (factory(seed) -> Env) or a registered env name"
    )
    parser.add_argument("--all", action="store_true", help="check every registered env (after importing targets)")
    parser.add_argument("--seed", type=count(0), default=0, help="first seed (default 0)")
    parser.add_argument(
        "--episodes", type=count(1), default=2, help="episodes played twice for determinism (default 2)"
    )
    parser.add_argument(
        "--n-hostile",
        type=count(0),
        default=40,
        help="hypothesis-generated hostile texts on top of the fixed corpus (default 40)",
    )


def resolve(target: str) -> tuple[str, Any]:
    """``(name, factory_or_env_name)`` for a CLI target."""
    if ":" not in target:
        return target, target
    module_name, _, attr = target.partition(":")
    sys.path.insert(0, ".")  # so `vlrl check-env my_envs:make` finds ./my_envs.py
    module = importlib.import_module(module_name)
    factory = module
    for part in attr.split("."):
        factory = getattr(factory, part)
    if not callable(factory):
        from vlrl.errors import UsageError

        raise UsageError(f"{target} is not callable")
    return target, factory


def run(args: argparse.Namespace) -> int:
    from vlrl.checks.envs import check_env
    from vlrl.envs import registered_envs
    from vlrl.envs.gym_adapter import quiet_sdl

    quiet_sdl()
    try:
        targets = [resolve(t) for t in args.targets]
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"vlrl check-env: cannot load target: {exc}", file=sys.stderr)
        return 2
    if args.all:
        targets += [(n, n) for n in registered_envs() if n not in {name for name, _ in targets}]
    if not targets:
        print("vlrl check-env: give a TARGET (module:factory or env name) or --all", file=sys.stderr)
        return 2
    failed = 0
    for name, factory in targets:
        report = check_env(
            factory,
            name=name,
            seed=args.seed,
            n_episodes=args.episodes,
            n_hostile=args.n_hostile,
            raise_on_failure=False,
        )
        print(report.summary())
        failed += not report.ok
    return 1 if failed else 0
