"""``vlrl bench``: engine, multi-turn and train throughput (with MFU and agreement) over a built checkpoint.

    vlrl bench --size tiny --device cpu --out benchmarks/results/bench_cpu_tiny.json
    vlrl bench --size 2b --device cuda --dtype bfloat16 --out benchmarks/results/bench_h100_2b.json
    vlrl bench --quick                                  # every section, tiny sizes, seconds on a CPU

The checkpoint is vlrl's random-init build of ``--size`` (``vlrl.models.build.cached_model_dir``, built on
first use, offline). What each section measures: ``vlrl.bench`` (package docstring and modules).
"""

from __future__ import annotations

import argparse
import json
from typing import get_args

from vlrl.cli import count
from vlrl.train.config import Kernels
from vlrl.vllm.config import Execution

DEFAULT_OUT = "benchmarks/results/bench_{device}_{size}.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="tiny", help="checkpoint size: tiny (CPU) or 2b (GPU)")
    parser.add_argument("--arch", default="qwen2_5_vl", help="qwen2_vl, qwen2_5_vl or qwen3_vl")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch-sizes", type=batch_sizes, default=None, help="engine batch sizes (default 1,8,64,256)")
    parser.add_argument("--max-tokens", type=count(1), default=None, help="new tokens per engine request (default 64)")
    parser.add_argument("--repeats", type=count(1), default=None, help="timed calls per batch size, best kept")
    parser.add_argument("--turns", type=count(1), default=None, help="multi-turn: turns per episode (default 16)")
    parser.add_argument("--episodes", type=count(1), default=None, help="multi-turn: episodes at once (default 8)")
    parser.add_argument("--train-steps", type=count(1), default=None, help="timed train steps (default 3)")
    parser.add_argument("--micro-batch", type=count(1), default=None, help="train micro-batch rows (default 4)")
    parser.add_argument(
        "--kernels", default="eager", choices=get_args(Kernels), help="model.kernels (vlrl.models.fused)"
    )
    parser.add_argument("--no-vllm", action="store_true", help="do not start vLLM (recorded as skipped)")
    parser.add_argument("--vllm-execution", default="auto", choices=get_args(Execution), help="the server's mode")
    parser.add_argument("--vllm-offline", action="store_true", help="also time raw offline vLLM (CUDA; +3 min)")
    parser.add_argument("--quick", action="store_true", help="tiny workloads, no vLLM: a smoke run in seconds")
    parser.add_argument("--out", default=None, help=f"JSON path (default {DEFAULT_OUT})")


def batch_sizes(text: str) -> tuple[int, ...]:
    """``1,8,64`` -> ``(1, 8, 64)``; every size an integer >= 1."""
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more sizes, each >= 1")
    return sizes


def config_from(args: argparse.Namespace):
    """The :class:`~vlrl.bench.run.BenchConfig` of the command line (``--quick`` first, then explicit flags)."""
    from vlrl.bench.run import BenchConfig
    from vlrl.errors import UsageError
    from vlrl.models.archs import ARCHS, SIZES

    if args.size not in SIZES:
        raise UsageError(f"--size {args.size!r}: expected one of {', '.join(SIZES)}")
    if args.arch not in ARCHS:
        raise UsageError(f"--arch {args.arch!r}: expected one of {', '.join(ARCHS)}")
    if not (args.device == "cpu" or args.device == "cuda" or args.device.startswith("cuda:")):
        raise UsageError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    given = {
        "batch_sizes": args.batch_sizes,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "turns": args.turns,
        "episodes": args.episodes,
        "train_steps": args.train_steps,
        "micro_batch": args.micro_batch,
    }
    fields = {"size": args.size, "arch": args.arch, "device": args.device, "dtype": args.dtype, "kernels": args.kernels}
    fields.update(vllm_execution=args.vllm_execution, vllm_offline=args.vllm_offline)
    fields.update({k: v for k, v in given.items() if v is not None})
    if args.no_vllm:
        fields["vllm"] = False
    return BenchConfig.quick(**fields) if args.quick else BenchConfig(**fields)


def run(args: argparse.Namespace) -> int:
    from vlrl.bench.run import run_bench, write
    from vlrl.errors import UsageError

    config = config_from(args)
    if config.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {config.device}: this torch sees no CUDA device")
    out = args.out or DEFAULT_OUT.format(device=config.device.split(":")[0], size=config.size)
    path = write(run_bench(config, save=lambda partial: write(partial, out)), out)
    print(json.dumps(_summary(json.loads(path.read_text())), indent=1))
    print(f"wrote {path}")
    return 0


def _summary(result: dict) -> dict:
    """The headline numbers, for the terminal."""
    eng = result["engines"]
    train = result["training"]["padded"]
    return {
        "device": result["device_name"],
        "embedded_tok_per_s": {n: t["tok_per_s"] for n, t in eng["embedded"].items()},
        "hf_generate_tok_per_s": {n: t["tok_per_s"] for n, t in eng["hf_generate"].items()},
        "vllm": result["vllm"].get("skipped") or {k: v for k, v in result["vllm"].items() if k != "startup_seconds"},
        "turn_seconds": [t["seconds"] for t in result["multi_turn"]["per_turn"]],
        "turn_increment_seconds": [t.get("increment_seconds") for t in result["multi_turn"]["per_turn"]],
        "train_tok_per_s": train["tok_per_s"],
        "mfu": train.get("mfu"),
        "agreement_max_abs": {k: v.get("max_abs", v.get("skipped")) for k, v in result["agreement"].items()},
    }
