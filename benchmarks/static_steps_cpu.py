"""The embedded engine's static decode steps (``graphs=True``, run eagerly off CUDA) against its eager steps on a
CPU: the bench workload (224 px image + question, eos ignored, T=1), best of 3 alternating calls, caches cleared.

    python benchmarks/static_steps_cpu.py --out benchmarks/results/static_steps_cpu_tiny.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    from vlrl.bench import env
    from vlrl.bench.engines import workload_messages
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    path = cached_model_dir("qwen2_5_vl", args.size)
    renderer = EmbeddedRenderer.from_pretrained(path)
    eager = EmbeddedEngine.from_pretrained(path, graphs=False)
    engines = {"eager": eager, "static": EmbeddedEngine(eager.model, eager.tokenizer, graphs=True)}
    results = []
    for n, tokens in ((8, 32), (64, 16)):
        prompts = [renderer.render(m) for m in workload_messages(n)]
        params = [SamplingParams(temperature=1.0, max_tokens=tokens, seed=i, ignore_eos=True) for i in range(n)]
        best = dict.fromkeys(engines, float("inf"))
        for _ in range(3):
            for name, engine in engines.items():
                engine.clear_caches()
                t0 = time.perf_counter()
                engine.generate(prompts, params)
                best[name] = min(best[name], time.perf_counter() - t0)
        results.append({"sequences": n, "new_tokens": tokens, "seconds": {k: round(v, 3) for k, v in best.items()}})
        print(results[-1])
    out = {"benchmark": "static_steps_cpu", "size": args.size, "git": env.git_commit(), **env.host(), "runs": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
