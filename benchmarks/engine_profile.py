"""Where one embedded-engine ``generate`` call spends its time, against HF generate on the same prompts; JSON out.

    python benchmarks/engine_profile.py OUT.json --size 2b --device cuda --dtype bfloat16 --rows 256

The workload is ``vlrl bench``'s (vlrl.bench.engines: a 224 px image and a question per row, T = 1, eos ignored).
Each side runs once warm, then once under ``torch.profiler``: wall seconds, the device's busy seconds (the sum of
its kernels: far below the wall means the host is the bound) and the top ops by host and by device time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import torch

    from vlrl.bench.engines import hf_generate_call, workload_messages
    from vlrl.bench.profiling import profiled
    from vlrl.bench.run import BenchConfig, load
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    config = BenchConfig(size=args.size, device=args.device, dtype=args.dtype)
    _, model, renderer = load(config)
    prompts = [renderer.render(m) for m in workload_messages(args.rows)]
    engine = EmbeddedEngine(model, renderer.tokenizer, max_batch=args.rows)
    params = [
        SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=i) for i in range(args.rows)
    ]

    def embedded() -> None:
        # the engine's own decode on this thread (``generate`` runs it on the engine's worker thread, which a
        # profiler started here does not see); the same batch ``generate`` would decode
        engine.clear_caches()
        requests = [engine._request(p, s) for p, s in zip(prompts, params)]
        with engine._lock:
            engine._decode(requests)

    generate = hf_generate_call(model, renderer.processor, prompts, args.device)

    def hf() -> None:
        generate(args.max_tokens)

    started = time.time()
    out = {
        "benchmark": "engine_profile",
        "config": vars(args),
        "embedded": profiled(embedded, args.device),
        "hf_generate": profiled(hf, args.device),
        "torch": torch.__version__,
    }
    out["wall_seconds"] = round(time.time() - started, 1)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for side in ("embedded", "hf_generate"):
        r = out[side]
        print(side, r["seconds"], "s; profiled", r["profiled_seconds"], "s; device busy", r["device_busy_seconds"], "s")
        for row in r["by_host"][:12]:
            print("   host", row)
        for row in r["by_device"][:8]:
            print("   dev ", row)


if __name__ == "__main__":
    main()
