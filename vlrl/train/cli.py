"""``vlrl train <recipe|file.toml> [section.key=value ...]``: run a training recipe.

    vlrl train color_square --report              # the main job: the tiny CPU recipe and its report.html
    vlrl train color_square run.steps=5 sft.steps=10 run.out=/tmp/run   # overrides go anywhere on the line
    vlrl train color_square data.env=my_envs:make_env sft.expert=my_envs:expert   # your own env (module:factory)
    vlrl train --help-config                      # every key, with its help
    vlrl train color_square --nproc 2             # FSDP2 over 2 processes: torchrun --nproc-per-node 2 -m vlrl train …

Several processes (one per GPU; gloo on CPU) are torchrun's: ``--nproc N`` starts them on this machine. Across
machines, run torchrun yourself on each (README, "Scale-out and LoRA").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from vlrl.errors import UsageError

INTERMIXED = True  # overrides after --report too (vlrl.cli)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", default="color_square", help="recipe name or TOML path")
    parser.add_argument(
        "overrides", nargs="*", help="section.key=value overrides (anywhere on the line; true/false for booleans)"
    )
    parser.add_argument("--help-config", action="store_true", help="print every config key with its help")
    parser.add_argument("--report", action="store_true", help="write <run>/report.html at the end")
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="train on N processes of this machine with FSDP2 (runs torchrun --nproc-per-node N)",
    )


def run(args: argparse.Namespace) -> int:
    from vlrl.train.config import load_config

    if args.help_config:
        print(config_help())
        return 0
    if "=" in args.recipe:  # `vlrl train run.steps=5`: an override, the recipe left at its default
        args.overrides, args.recipe = [args.recipe, *args.overrides], "color_square"
    cfg = load_config(args.recipe, args.overrides)  # refused here, before any process starts
    if args.nproc is not None and "LOCAL_RANK" not in os.environ:
        return torchrun(args)
    from vlrl.train.loop import train

    summary = train(cfg)
    if os.environ.get("RANK", "0") != "0":  # every rank returns the summary; rank 0 reports it
        return 0
    if args.report:
        from vlrl.report.training import write_report

        summary["report"] = str(write_report(cfg.out_dir))
    print(json.dumps(summary))
    return 0


def torchrun(args: argparse.Namespace) -> int:
    """``vlrl train … --nproc N`` as ``torchrun --standalone --nproc-per-node N -m vlrl train …``; its status."""
    if args.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {args.nproc}")
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        "-m",
        "vlrl",
        "train",
        args.recipe,
        *args.overrides,
        *(["--report"] if args.report else []),
    ]
    return subprocess.run(argv, check=False).returncode


def config_help() -> str:
    """Every key with its help, section by section."""
    import dataclasses
    import typing

    from vlrl.algos.config import attribute_docs
    from vlrl.train.config import SECTIONS
    from vlrl.train.config_values import table_type

    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"[{section}]")
        docs = attribute_docs(cls)
        for f in dataclasses.fields(cls):
            factory = f.default_factory
            default = factory() if callable(factory) else f.default
            lines.append(f"  {section}.{f.name} = {default!r}\n      {docs.get(f.name, '')}")
            table = table_type(typing.get_type_hints(cls)[f.name])
            if table is not None:  # a table inside the section (model.lora): its keys too
                sub = attribute_docs(table)
                for g in dataclasses.fields(table):
                    lines.append(f"  {section}.{f.name}.{g.name} = {g.default!r}\n      {sub.get(g.name, '')}")
    return "\n".join(lines)
