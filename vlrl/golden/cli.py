"""``vlrl golden regen|check|list``: rewrite or verify golden token / loss-mask files.

Your project's scenarios (a module with ``SCENARIOS = [vlrl.golden.Scenario(...)]``, see
:mod:`vlrl.golden.user`), into ``./golden`` unless ``--dir``; only that module's files are touched::

    vlrl golden regen --scenarios my_scenarios [--only NAME] [--dir golden]
    vlrl golden check --scenarios my_scenarios     # exit 1 with a token-level diff per changed file

Without ``--scenarios``: vlrl's own built-in scenarios, in vlrl's checkout (or an explicit ``--dir``)::

    vlrl golden regen                      # every arch × scenario into the checkout's golden/
    vlrl golden regen --arch qwen3_vl --scenario maze2d_multi_turn

Files are written only through this command (or the pytest flags ``--vlrl-update-golden`` /
``--vlrl-regen-all``); read ``git diff golden/`` before committing them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlrl.errors import UsageError
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
    parser.add_argument(
        "--scenarios",
        metavar="MODULE",
        default=None,
        help="your project's scenarios: a module with SCENARIOS = [vlrl.golden.Scenario(...)] (found from ./)",
    )
    parser.add_argument("--only", action="append", metavar="NAME", help="with --scenarios: only this one (repeatable)")
    parser.add_argument(
        "--dir",
        default=None,
        help="golden folder (default: ./golden with --scenarios; vlrl's checkout's golden/ for the built-ins)",
    )
    parser.add_argument("--model-cache", default=None, help="checkpoint cache (default: $VLRL_CACHE or ~/.cache/vlrl)")


def run(args: argparse.Namespace) -> int:
    if args.scenarios is not None:
        return run_user(args)
    if args.only:
        raise UsageError("--only picks scenarios of --scenarios MODULE; vlrl's built-ins are picked with --scenario")
    if args.action == "list":
        for name, sc in SCENARIOS.items():
            print(f"{name:<22} {sc.description}")
        return 0
    changed = 0
    root = builtin_dir(args.dir)
    for arch, name, actual in generate(args.arch or ARCHS, args.scenario or list(SCENARIOS), args.model_cache):
        changed += handle(root, arch, name, actual, write=args.action == "regen")
    verb = "rewrote" if args.action == "regen" else "differ:"
    print(f"{verb} {changed} golden file(s)" if changed else "golden files are up to date")
    return 1 if changed and args.action == "check" else 0


def builtin_dir(explicit: str | None) -> Path:
    """Where vlrl's built-in goldens go: an explicit ``--dir``, else the checkout's ``golden/`` when run inside
    vlrl's checkout. Anywhere else it refuses, so a user's ``golden/`` never gets vlrl's files."""
    if explicit is not None:
        return Path(explicit)
    checkout = Path(__file__).resolve().parents[2]
    cwd = Path.cwd().resolve()
    if (checkout / "golden").is_dir() and (cwd == checkout or checkout in cwd.parents):
        return checkout / "golden"
    raise UsageError(
        "without --scenarios, `vlrl golden` works on vlrl's own built-in goldens, inside vlrl's checkout; for "
        "this project's goldens: vlrl golden regen --scenarios MODULE (a module with "
        "SCENARIOS = [vlrl.golden.Scenario(...)])"
    )


def run_user(args: argparse.Namespace) -> int:
    """``--scenarios MODULE``: that module's scenarios only, in ``--dir`` (default ./golden)."""
    from vlrl.golden.user import load_scenarios, regen_command, render_user_scenario, renderer_for

    if args.scenario:
        raise UsageError("--scenario picks vlrl's built-ins; with --scenarios MODULE pick yours with --only NAME")
    scenarios = load_scenarios(args.scenarios)
    names = {s.name for s in scenarios}
    unknown = [n for n in args.only or () if n not in names]
    if unknown:
        raise UsageError(f"--only {', '.join(unknown)}: not in {args.scenarios}.SCENARIOS ({', '.join(sorted(names))})")
    picked = [s for s in scenarios if (not args.only or s.name in args.only) and (not args.arch or s.arch in args.arch)]
    if args.action == "list":
        for s in picked:
            print(f"{s.name:<22} {s.arch:<11} {s.env}  {s.description}")
        return 0
    root = Path(args.dir or "golden")
    changed, renderers = 0, {}
    for s in picked:
        if s.arch not in renderers:
            renderers[s.arch] = renderer_for(s.arch, args.model_cache)
        renderer, context = renderers[s.arch]
        differs = handle(root, s.arch, s.name, render_user_scenario(s, renderer, context), write=args.action == "regen")
        if differs and args.action == "check":
            print(f"  fix: {regen_command(args.scenarios, s.name, args.dir or 'golden')}")
        changed += differs
    verb = "rewrote" if args.action == "regen" else "differ:"
    print(f"{verb} {changed} golden file(s)" if changed else f"golden files of {args.scenarios} are up to date")
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
