"""Raw vLLM offline: ``LLM.chat`` on the bench workload with vLLM's own defaults, in a child process.

The reference the vLLM-on-GPU issue measures vlrl's rollout path against ("raw vLLM offline generate"): what a
plain vLLM user gets from ``vllm.LLM`` — torch.compile and CUDA graphs as vLLM chooses them, the image as a data
URI that vLLM processes itself, all of a batch's conversations in one call, ``ignore_eos``, T = 1, seed ``i``.
Only memory is set, because the bench's own process already holds the policy: the KV cache to ``kv_cache_gib``
and the start-up check's fraction to ``gpu_memory_utilization``.

A child process because an ``LLM`` keeps its GPU memory and its engine process until its interpreter exits; the
server the bench starts next needs the memory back. Each batch is warmed up once on images of its own and timed
on fresh ones, as :mod:`vlrl.bench.vllm_paths` times its paths.

    python -m vlrl.bench.vllm_offline MODEL_DIR --dtype bfloat16 --batch-sizes 64,256 --max-tokens 128 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MARK = "vlrl-offline-result: "
"""The child's result line on stdout (vLLM logs to the same streams)."""


def offline_section(
    model_dir: str | Path,
    batch_sizes: Sequence[int],
    max_tokens: int,
    repeats: int,
    dtype: str,
    *,
    kv_cache_gib: int = 16,
    gpu_memory_utilization: float = 0.3,
    timeout_s: float = 480.0,
) -> dict[str, Any]:
    """``{"startup_seconds", "version", "<n>": {"seconds", "tokens", "tok_per_s", "all_seconds"}}`` from the child,
    or ``{"error": ...}`` naming why it gave none (its log tail)."""
    argv = [
        sys.executable,
        "-m",
        "vlrl.bench.vllm_offline",
        str(model_dir),
        "--dtype",
        dtype,
        "--batch-sizes",
        ",".join(str(n) for n in batch_sizes),
        "--max-tokens",
        str(max_tokens),
        "--repeats",
        str(repeats),
        "--kv-cache-gib",
        str(kv_cache_gib),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"no result within {timeout_s:.0f} s", "log_tail": _text(exc.stdout)[-2000:]}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (done.stdout + done.stderr)[-2000:]
    return {"error": f"the child exited with code {done.returncode} without a result", "log_tail": tail}


def _text(data: bytes | str | None) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else (data or "")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The child's work: start one ``LLM``, then per batch size a warm-up batch and ``repeats`` timed ones."""
    import vllm
    from vllm import LLM, SamplingParams

    from vlrl.bench.vllm_paths import fresh_batches

    t0 = time.perf_counter()
    llm = LLM(
        model=args.model_dir,
        dtype=args.dtype,
        limit_mm_per_prompt={"image": 1, "video": 0},
        kv_cache_memory_bytes=args.kv_cache_gib * 2**30,
        gpu_memory_utilization=args.gpu_memory_utilization,
        seed=0,
    )
    out: dict[str, Any] = {"startup_seconds": round(time.perf_counter() - t0, 2), "version": vllm.__version__}

    def run(batch: list[list[Any]]) -> int:
        params = [
            SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=i)
            for i in range(len(batch))
        ]
        outputs = llm.chat(batch, sampling_params=params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    for n in args.batch_sizes:
        batches = fresh_batches(n, 1 + args.repeats)
        run(batches[0])
        times, tokens = [], 0
        for batch in batches[1:]:
            t = time.perf_counter()
            tokens = run(batch)
            times.append(time.perf_counter() - t)
        best = min(times)
        out[str(n)] = {
            "seconds": round(best, 4),
            "tokens": tokens,
            "tok_per_s": round(tokens / best, 2),
            "all_seconds": [round(t, 4) for t in times],
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vlrl.bench.vllm_offline", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-gib", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    result = measure(parser.parse_args(argv))
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
