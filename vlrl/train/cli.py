"""``vlrl train <recipe|file.toml> [section.key=value ...]``: run a training recipe.

    vlrl train color_square                       # the tiny CPU recipe (vlrl/recipes/color_square.toml)
    vlrl train color_square run.steps=5 sft.steps=10 run.out=/tmp/run
    vlrl train --help-config                      # every key, with its help
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", default="color_square", help="recipe name or TOML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    parser.add_argument("--help-config", action="store_true", help="print every config key with its help")
    parser.add_argument("--report", action="store_true", help="write <run>/report.html at the end")


def run(args: argparse.Namespace) -> int:
    from vlrl.train.config import config_help, load_config

    if args.help_config:
        print(config_help())
        return 0
    from vlrl.train.loop import train

    cfg = load_config(args.recipe, args.overrides)
    summary = train(cfg)
    if args.report:
        from vlrl.report.training import write_report

        summary["report"] = str(write_report(cfg.out_dir))
    print(json.dumps(summary))
    return 0
