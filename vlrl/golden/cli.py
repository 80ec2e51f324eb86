"""``vlrl golden regen|check``: rewrite or verify the golden token / loss-mask files.

    vlrl golden regen                      # every arch × scenario into ./golden
    vlrl golden regen --arch qwen3_vl --scenario maze2d_multi_turn
    vlrl golden check                      # exit 1 with a token-level diff per changed file

Files are written only through this command (or the pytest flags ``--vlrl-update-golden`` /
``--vlrl-regen-all``); read ``git diff golden/`` before committing them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlrl.golden.scenarios import SCENARIOS
from vlrl.models.archs import ARCHS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("regen", "check", "list"),
        help="regen: rewrite files; check: compare; list: print the scenarios",
    )
    parser.add_argument("--arch", action="append", choices=ARCHS, help="only this architecture (repeatable)")
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="only this scenario (repeatable)"
    )
    parser.add_argument("--dir", default="golden", help="golden folder (default: ./golden)")
    parser.add_argument("--model-cache", default=None, help="checkpoint cache (default: $VLRL_CACHE or ~/.cache/vlrl)")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name, sc in SCENARIOS.items():
            print(f"{name:<22} {sc.description}")
        return 0
    changed = 0
    for arch, name, actual in generate(args.arch or ARCHS, args.scenario or list(SCENARIOS), args.model_cache):
        changed += handle(Path(args.dir), arch, name, actual, write=args.action == "regen")
    verb = "rewrote" if args.action == "regen" else "differ:"
    print(f"{verb} {changed} golden file(s)" if changed else "golden files are up to date")
    return 1 if changed and args.action == "check" else 0


def generate(archs, scenarios, model_cache=None):
    """Yield ``(arch, scenario, golden text)`` with each tiny checkpoint loaded once."""
    from vlrl.golden.files import render_scenario
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer

    for arch in archs:
        path = cached_model_dir(arch, "tiny", cache_root=model_cache)
        renderer = EmbeddedRenderer.from_pretrained(path)
        context = _max_context(path)  # scripted scenarios need the model's context size, not its weights
        for name in scenarios:
            yield arch, name, render_scenario(arch, name, renderer, context)


def _max_context(path) -> int:
    import json

    config = json.loads((Path(path) / "config.json").read_text())
    return int(config.get("text_config", config)["max_position_embeddings"])


def handle(root: Path, arch: str, name: str, actual: str, *, write: bool) -> int:
    from vlrl.golden.files import GoldenFormatError, golden_diff, golden_path

    path = golden_path(root, arch, name)
    try:
        expected = path.read_text(encoding="utf-8") if path.exists() else None
    except UnicodeDecodeError as exc:
        if not write:
            line = path.read_bytes()[: exc.start].count(b"\n") + 1
            raise GoldenFormatError(path, line, f"not UTF-8 text ({exc.reason})") from None
        expected = None
    if expected == actual:
        return 0
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8", newline="\n")
        print(f"wrote {path}")
    else:
        print(f"{path}: " + ("missing" if expected is None else "differs\n" + golden_diff(expected, actual, path=path)))
    return 1
