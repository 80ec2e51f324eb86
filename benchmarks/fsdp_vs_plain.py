"""FSDP2 on one rank against the plain trainer: the step-time ratio that the FSDP issue bounds (at most 1.10).

Two ways to measure it, each writing JSON:

- **Launched in turn** (``benchmarks/fsdp_throughput.py --plain --rounds N``, through ``paired_rounds`` here): each
  side in its own process, the order alternating. The step time of one process drifts with its host: the same
  plain step took 2.3-5.6 s across launches of one command on an H200 (benchmarks/results/fsdp_h100/9836154,
  5f98160), so a ratio of medians moved between 0.86 and 1.44 from round to round.
- **Interleaved in one process** (this script): under torchrun with one rank, the plain model and the FSDP2 model are
  built side by side, on the same trajectories, and their steps alternate (FSDP, plain, plain, FSDP, ...), so the two
  sides of each pair see the same host at the same minutes. ``fsdp_over_plain_step_time``: the median over pairs
  of FSDP's step time over plain's. Each side's step is ``benchmarks/fsdp_throughput.py``'s: the logprob pass, one
  update (``Trainer.sft_step``), the weight sync's gather. Both models live on the device at once (the 2b model
  in bf16 with fp32 masters on both sides: about 110 GiB at 64 rows and micro-batch 8: an H200, not an H100).

    python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/fsdp_vs_plain.py \\
        --size 2b --device cuda --dtype bfloat16 --rows 64 --micro-batch 8 --steps 8 --out OUT.json
    python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/fsdp_vs_plain.py \\
        --size tiny --device cpu --dtype float32 --rows 4 --turns 2 --steps 2 --warmup 1 --out OUT.json  # CPU smoke

``--sides A,B`` pairs two other sides (the ratio is A's step time over B's; the keys keep their ``fsdp_over_plain``
names): ``fsdp_fp32_reduce`` is FSDP2 reducing and accumulating its gradients in fp32, its one-rank default until
session 54 (on one rank ``fsdp`` now sums the micro-batches' gradients in the compute dtype, as the plain trainer
does; ``vlrl.train.fsdp``'s "Precision"): ``--sides fsdp_fp32_reduce,plain`` times what that choice saves. Each
JSON records its sides' ``reduce_dtypes``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

import fsdp_throughput as ft  # this script's folder is on sys.path[0]
import torch
from torch_profiles import profiled


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen2_5_vl")
    p.add_argument("--size", default="2b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--rows", type=int, default=64, help="trajectories per step")
    p.add_argument("--turns", type=int, default=8, help="maze turns per trajectory (an image each)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="timed pairs")
    p.add_argument("--warmup", type=int, default=1, help="untimed pairs first")
    p.add_argument("--group-fraction", type=float, default=None, help="FSDP group size (0: a group per block)")
    p.add_argument("--sides", default="fsdp,plain", help="the two sides paired, of fsdp, plain, fsdp_fp32_reduce")
    p.add_argument("--profile", action="store_true", help="then profile one more update of each side")
    p.add_argument("--out", required=True)
    return p.parse_args()


def main() -> None:
    from vlrl.models.build import cached_model_dir
    from vlrl.train import distributed as D
    from vlrl.train.batch import CollateSpec, collate

    args = parse()
    d = D.init_distributed(args.device)
    if d.world != 1:
        raise SystemExit(f"fsdp_vs_plain: one rank (torchrun --nproc-per-node 1), not {d.world}")
    dtype = getattr(torch, args.dtype)
    if d.device.startswith("cuda") and dtype == torch.float32:  # fp32 means fp32, as in vlrl.train.run
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    names = args.sides.split(",")
    if len(names) != 2 or not set(names) <= set(SIDES):
        raise SystemExit(f"fsdp_vs_plain: --sides takes two of {', '.join(SIDES)}, got {args.sides!r}")
    sides = {name: build_side(args, name, d, dtype) for name in names}
    model_dir = cached_model_dir(args.arch, args.size)
    batch = collate(ft.trajectories(args, model_dir, args.rows), CollateSpec.from_model(sides[names[0]][0]))
    times: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    losses: dict[str, list[float]] = {side: [] for side in sides}
    for step in range(args.warmup + args.steps):
        for side in names if step % 2 == 0 else names[::-1]:
            model, trainer, dd = sides[side]
            took, metrics, weights = ft.timed_step(model, trainer, batch, dd, dtype)
            del weights  # the gathered copy (4.4 GB for the 2b model) does not stay through the other side's step
            losses[side].append(metrics["loss"])
            if step >= args.warmup:
                for key, value in took.items():
                    times[side].setdefault(key, []).append(value)
    result = summary(args, d, times, losses) | {"reduce_dtypes": {n: reduce_dtype(n, d, dtype) for n in sides}}
    if args.profile:  # after the timed pairs: the profiler's overhead stays out of them
        result["profile"] = {side: profiled(lambda s=s: s[1].sft_step(batch), s[2])[1] for side, s in sides.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("profile", *sides)}, indent=2))
    D.close_distributed()


SIDES = ("fsdp", "plain", "fsdp_fp32_reduce")


def build_side(args, name: str, d, dtype: torch.dtype) -> tuple:
    """A side's model, trainer and ``Dist``: FSDP2 on this one rank (``shard_model``'s default reduce dtype, or
    fp32), or the plain trainer."""
    from vlrl.train import distributed as D

    if name == "plain":
        single = D.Dist.single(d.device)
        return (*ft.build(args, single, dtype)[:2], single)
    reduce = torch.float32 if name == "fsdp_fp32_reduce" else None
    return (*ft.build(args, d, dtype, reduce)[:2], d)


def reduce_dtype(side: str, d, dtype: torch.dtype) -> str | None:
    """The dtype a side's gradients are reduced and summed in (None: the plain trainer's own, ``dtype``)."""
    from vlrl.train.fsdp import default_reduce_dtype

    if side == "plain":
        return None
    return "float32" if side == "fsdp_fp32_reduce" else str(default_reduce_dtype(d, dtype)).removeprefix("torch.")


def summary(args, d, times: dict, losses: dict) -> dict:
    """Each side's step times and medians; each pair's ratio; the losses of both sides (same data, same start)."""
    from vlrl.bench.env import device_name, git_commit

    a, b = args.sides.split(",")
    pairs = [f / p for f, p in zip(times[a]["step_s"], times[b]["step_s"], strict=True)]
    updates = [f / p for f, p in zip(times[a]["update_s"], times[b]["update_s"], strict=True)]
    return {
        "benchmark": "fsdp_vs_plain",
        "commit": git_commit(),
        "device": device_name(d.device),
        "torch": torch.__version__,
        "arch": args.arch,
        "size": args.size,
        "dtype": args.dtype,
        "rows": args.rows,
        "turns": args.turns,
        "micro_batch": args.micro_batch,
        "group_fraction": args.group_fraction,
        "sides": [a, b],
        "pairs": args.steps,
        "fsdp_over_plain_step_time": statistics.median(pairs),
        "fsdp_over_plain_step_time_ci95": median_ci95(pairs),
        "fsdp_over_plain_update_time": statistics.median(updates),
        "pair_ratios": pairs,
        "ratio_of_median_steps": statistics.median(times[a]["step_s"]) / statistics.median(times[b]["step_s"]),
        "losses": losses,
        "loss_max_abs_diff": max(abs(x - y) for x, y in zip(losses[a], losses[b], strict=True)),
        **{side: {**t, **{f"{k}_median": statistics.median(v) for k, v in t.items()}} for side, t in times.items()},
    }


def median_ci95(values: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of ``values`` (percentile method, seeded): how far the pairs' median
    could move with other pairs of the same kind. Neighbouring steps differ by up to ±20 % on the GPU host, so one
    run's median alone says little about where the bar lies against it."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


if __name__ == "__main__":
    main()
