"""Embedded-engine decode throughput vs plain HF generate, engine section only; writes JSON.

    python benchmarks/engine_throughput.py --size tiny --device cpu --out benchmarks/results/engine_cpu_tiny.json
    python benchmarks/engine_throughput.py --size 2b --device cuda --dtype bfloat16 --baseline \
        --out benchmarks/results/engine_gpu_2b.json

A thin wrapper over :mod:`vlrl.bench.engines` (the workload and timing rules are stated there); the
whole benchmark (vLLM, multi-turn, training, MFU, agreement) is ``vlrl bench``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    import torch

    from vlrl.bench import env
    from vlrl.bench.engines import engine_section
    from vlrl.bench.run import BenchConfig, load

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="qwen2_5_vl")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", action="store_true", help="kept for old callers: HF generate is always timed now")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    config = BenchConfig(size=args.size, device=args.device, dtype=args.dtype, arch=args.arch)
    _, model, renderer = load(config)
    results = {
        "arch": args.arch,
        "size": args.size,
        "device": args.device,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "torch": torch.__version__,
        "gpu": env.device_name(args.device) if args.device.startswith("cuda") else None,
        "versions": env.versions(),
        "git": env.git_commit(),
        **env.host(),
        **engine_section(model, renderer, args.concurrency, args.max_tokens, args.repeats, args.device),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: results[k] for k in ("embedded", "hf_generate")}))


if __name__ == "__main__":
    main()
