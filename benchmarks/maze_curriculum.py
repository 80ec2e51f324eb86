"""The maze curriculum under a wall-clock budget: levels in order, each level starting from the weights the
last one ended with (the first from random init), SFT then GRPO (vlrl.envs.maze_curriculum).

    python benchmarks/maze_curriculum.py --out /tmp/mc --plan 5x5:150:240 [--plan 7x7:60:200] \
        [--weights DIR [--grow-text-layers N]] [--set section.key=value ...] [--json results.json]

A plan is ``level:sft_seconds:rl_seconds``; ``--set`` overrides apply to every level. Writes per level
``<out>/<level>/`` (metrics, agreement, samples, summary, report.html, weights/) and the results JSON: per
level the SFT and RL steps, the seconds of each phase, and greedy success on the level's fixed eval split
after SFT and after RL with 95 % intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vlrl.envs.maze_curriculum import LevelPlan, train_level, write_results


def takeover_arg(text: str) -> tuple[int, int]:
    """``--takeover N:M`` as ``(N, M)``, two integers >= 0."""
    every, _, turns = text.partition(":")
    if not (every.isdigit() and turns.isdigit()):
        raise argparse.ArgumentTypeError(f"expected N:M, two integers >= 0 (e.g. 4:12), got {text!r}")
    return int(every), int(turns)


def forks_arg(text: str) -> tuple[float, int]:
    """``--fork-mazes SHARE:DRAW`` as ``(share, draw)``: a share in [0, 1] and a whole number of candidates a row
    >= 1 (LevelPlan.fork_mazes)."""
    share, _, draw = text.partition(":")
    try:
        picked = float(share), int(draw)
    except ValueError:
        picked = (-1.0, 0)
    if not (0.0 <= picked[0] <= 1.0 and picked[1] >= 1):
        raise argparse.ArgumentTypeError(
            f"expected SHARE:DRAW, a share in [0, 1] and a draw >= 1 (e.g. 0.5:6), got {text!r}"
        )
    return picked


def seconds_gone(text: str) -> float:
    """``--sft-warmup SECONDS`` (before 2026-12-05) is refused, not read as an abbreviation of the steps flag: a
    level's first batch (15-30 s) had used up the seconds before the second step."""
    raise argparse.ArgumentTypeError(
        f"the warm-up counts steps now: use --sft-warmup-steps N instead of seconds ({text!r})"
    )


def parse_plan(text: str, args: argparse.Namespace) -> LevelPlan:
    """``level:sft_seconds:rl_seconds[:sft_pool[:first_turn_seconds]]``, with the run-wide options of ``args``."""
    level, sft, rl, *rest = text.split(":")
    scale = tuple((k, float(v)) for k, v in (item.split("=") for item in args.sft_scale))
    return LevelPlan(
        level,
        float(sft),
        float(rl),
        overrides=tuple(args.set),
        eval_every=args.eval_every,
        sft_lr_scale=scale,
        model=args.model,
        init=args.init,
        image_side=args.image_side,
        image_stats=args.image_stats,
        mask_detours=args.mask_detours,
        sft_pool=int(rest[0]) if rest else LevelPlan.sft_pool,
        sft_fill=args.sft_fill,
        sft_builders=args.sft_builders,
        sft_prefetch=args.sft_prefetch,
        sft_warmup_steps=args.sft_warmup_steps,
        first_turns=float(rest[1]) if len(rest) > 1 else args.first_turns,
        first_start=args.first_start,
        sft_until=args.sft_until,
        probe_seconds=args.probe_seconds,
        takeover=args.takeover,
        fork_mazes=args.fork_mazes,
        snapshot_seconds=args.snapshot_seconds,
    )


def parser() -> argparse.ArgumentParser:
    """The command line (the levels' plans, the start and every level's settings)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--plan", action="append", required=True, help="level:sft_s:rl_s[:sft_pool[:first_turn_s]] (repeatable)"
    )
    ap.add_argument("--weights", default=None, help="model dir to start the first level from (default random init)")
    ap.add_argument("--grow-text-layers", type=int, default=0, help="first deepen --weights' text model to N layers")
    ap.add_argument("--set", action="append", default=[], help="section.key=value for every level")
    ap.add_argument("--model", choices=["tiny", "small"], default="tiny", help="random-init model of the first level")
    ap.add_argument("--init", choices=["normal", "fan_in"], default="normal", help="how that model's weights are drawn")
    ap.add_argument("--sft-scale", action="append", default=[], help="group=factor on sft.lr (vision, merger, ...)")
    ap.add_argument(
        "--image-side", type=int, default=None, help="px a side the random-init model's processor keeps unresized"
    )
    ap.add_argument("--mask-detours", action="store_true", help="the expert's detour turns out of the SFT loss")
    ap.add_argument(
        "--sft-fill",
        choices=["first", "background", "processes"],
        default="first",
        help="how the SFT pool fills (maze_sft_pool)",
    )
    ap.add_argument(
        "--sft-builders",
        type=int,
        default=0,
        help="worker processes of --sft-fill processes (0: cores-2, at most 12 GiB of free memory each)",
    )
    ap.add_argument(
        "--sft-prefetch", action="store_true", help="fetch and copy each SFT batch while the step before trains"
    )
    ap.add_argument(
        "--sft-warmup-steps", type=int, default=0, help="SFT steps of linear lr warm-up from 0 (e.g. 30 from weights)"
    )
    ap.add_argument("--sft-warmup", type=seconds_gone, help=argparse.SUPPRESS)
    ap.add_argument("--first-turns", type=float, default=0.0, help="seconds of SFT on the first turns alone first")
    ap.add_argument(
        "--first-start", choices=["corner", "random"], default="corner", help="where those first turns start"
    )
    ap.add_argument("--image-stats", choices=["model", "maze"], default="model", help="that model's pixel stats")
    ap.add_argument("--sft-until", type=float, default=0.0, help="end SFT once probe success reaches this fraction")
    ap.add_argument("--probe-seconds", type=float, default=10.0, help="seconds between those probes")
    ap.add_argument(
        "--takeover",
        type=takeover_arg,
        default=(0, 12),
        help="N:M, every N-th SFT step on takeover episodes: the policy plays up to M turns, then the expert (0: off)",
    )
    ap.add_argument(
        "--fork-mazes",
        type=forks_arg,
        default=(0.0, 1),
        help="SHARE:DRAW, whole-episode SFT batches pick SHARE of their rows from DRAW times as many candidates, "
        "those with a fork where heading for the goal turns from the right way (0:1: as drawn)",
    )
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every N RL steps")
    ap.add_argument(
        "--snapshot-seconds", type=float, default=0.0, help="save the weights every N s of SFT (<level>/snapshots)"
    )
    ap.add_argument("--json", default=None, help="results file (default <out>/results.json)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.grow_text_layers and not args.weights:
        ap.error("--grow-text-layers deepens the model of --weights: name one")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, weights, t0 = [], args.weights, time.time()
    if args.grow_text_layers:
        from vlrl.envs.maze_models import grow_text_layers

        # beside the run's dir, not in it: lease.sh packs the newest weights under it and tars the rest
        weights = str(grow_text_layers(args.weights, out.with_name(f"{out.name}.grown"), args.grow_text_layers))
    for text in args.plan:
        plan = parse_plan(text, args)
        result = train_level(plan, out / plan.level, model_path=weights)
        results.append(result)
        weights = result.weights
        write_results(results, args.json or out / "results.json")
        evals = ", ".join(
            f"{e.label} {e.solved}/{e.episodes} [{e.low:.3f}, {e.high:.3f}]"
            + ("" if e.within_visgym is None else f" ({e.within_visgym} within VisGym's turns)")
            + (f", {e.cut_by_context} cut by the model's context" if e.cut_by_context else "")
            for e in result.evals
        )
        print(
            json.dumps(
                {
                    "level": plan.level,
                    "sft_steps": result.sft_steps,
                    "sft_episodes": result.sft_episodes,
                    "rl_steps": result.rl_steps,
                    "sft_s": result.sft_seconds,
                    "rl_s": result.rl_seconds,
                    "evals": evals,
                    "elapsed_s": round(time.time() - t0, 1),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
