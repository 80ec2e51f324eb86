"""Where vlrl's in-process vLLM path (``vlrl.vllm.inprocess``) loses to raw offline ``LLM.chat``: one ``LLM`` with
vlrl's settings, the bench workload (224 px image + question, 128 new tokens, ``ignore_eos``, T = 1, seed i), timed
as five variants on fresh images each (a warm-up batch, then the best of ``--repeats``):

- ``chat``: ``LLM.chat`` as a plain user calls it (vLLM renders and processes the images itself);
- ``chat_vlrl_params``: the same with vlrl's per-request extras (the sampled token's logprob, the vision-token ban);
- ``render``: the embedded renderer alone, all of a batch concurrently (its thread pool);
- ``generate``: vlrl's ``generate`` on prompts rendered beforehand (the engine alone);
- ``path``: the bench's vlrl path: render and ``agenerate`` per request, all concurrently.

    python3 benchmarks/inprocess_breakdown.py OUT.json [--execution graphs] [--sizes 64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best(run, batches, prepare=lambda b: b) -> dict:
    """``run(prepare(batch))`` once as the warm-up, then timed on each later batch; the fastest kept."""
    run(prepare(batches[0]))
    times, tokens = [], 0
    for batch in batches[1:]:
        ready = prepare(batch)
        t0 = time.perf_counter()
        tokens = run(ready)
        times.append(time.perf_counter() - t0)
    s = min(times)
    return {"seconds": round(s, 4), "tokens": tokens, "tok_per_s": round(tokens / s, 1), "all_seconds": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--execution", default="graphs")
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--variants", default="chat,chat_vlrl_params,render,generate,path", help="run in this order")
    parser.add_argument("--gather-cap", type=float, default=0.25, help="InprocessVllmEngine(gather_cap_s=)")
    args = parser.parse_args()
    from vlrl.bench.vllm_paths import fresh_batches  # vlrl first: its torchvision guard before vLLM's import
    from vlrl.engines.types import SamplingParams
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.vllm.config import BAN_KEY, ServerConfig
    from vlrl.vllm.inprocess import InprocessVllmEngine

    VllmSampling = importlib.import_module("vllm").SamplingParams  # after vlrl's torchvision guard

    model_dir = cached_model_dir("qwen2_5_vl", os.environ.get("VLRL_BREAKDOWN_SIZE", "2b"))
    cfg = ServerConfig(
        str(model_dir),
        dtype=os.environ.get("VLRL_BREAKDOWN_DTYPE", "bfloat16"),
        max_images_per_prompt=1,
        kv_cache_gib=int(os.environ.get("VLRL_BREAKDOWN_KV_GIB", "16")),
        gpu_memory_utilization=0.3,
        execution=args.execution,
    )
    engine = InprocessVllmEngine(cfg, gather_cap_s=args.gather_cap)
    renderer = EmbeddedRenderer.from_pretrained(model_dir, workers=min(8, os.cpu_count() or 1))
    result: dict = {"startup_seconds": round(engine.startup_seconds, 1), "execution": args.execution}
    result["gather_cap_s"] = args.gather_cap
    out = Path(args.out)
    n_tok = args.max_tokens

    def chat(extras: dict):
        def run(batch) -> int:
            params = [
                VllmSampling(temperature=1.0, max_tokens=n_tok, ignore_eos=True, seed=i, **extras)
                for i in range(len(batch))
            ]
            outs = engine._driver.call(
                lambda: engine.llm.chat(batch, sampling_params=params, use_tqdm=False), when_idle=True
            )
            return sum(len(o.outputs[0].token_ids) for o in outs)

        return run

    async def render_all(batch):
        return await asyncio.gather(*(renderer.arender(m) for m in batch))

    def generate(prompts) -> int:
        params = [
            SamplingParams(temperature=1.0, max_tokens=n_tok, ignore_eos=True, seed=i) for i in range(len(prompts))
        ]
        return sum(len(g.token_ids) for g in engine.generate(prompts, params))

    async def path_all(batch) -> int:
        async def one(i, m):
            prompt = await renderer.arender(m)
            sp = SamplingParams(temperature=1.0, max_tokens=n_tok, ignore_eos=True, seed=i)
            return len((await engine.agenerate(prompt, sp)).token_ids)

        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))

    ban = {"logprobs": 0, "extra_args": {BAN_KEY: list(engine.banned_ids)}}
    variants = [
        ("chat", chat({}), None),
        ("chat_vlrl_params", chat(ban), None),
        ("render", lambda b: len(asyncio.run(render_all(b))), None),
        ("generate", generate, lambda b: asyncio.run(render_all(b))),
        ("path", lambda b: asyncio.run(path_all(b)), None),
    ]
    by_name = {v[0]: v for v in variants}
    variants = [by_name[name] for name in args.variants.split(",")]  # in the order asked
    for n in [int(x) for x in args.sizes.split(",")]:
        pool = fresh_batches(n, len(variants) * (1 + args.repeats))
        for k, (name, run, prepare) in enumerate(variants):
            batches = pool[k * (1 + args.repeats) : (k + 1) * (1 + args.repeats)]
            try:
                result.setdefault(name, {})[str(n)] = best(run, batches, prepare or (lambda b: b))
            except Exception as exc:  # noqa: BLE001 — recorded, the next variant still runs
                result.setdefault(name, {})[str(n)] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            out.write_text(json.dumps(result, indent=1))
            print(name, n, result[name][str(n)], flush=True)
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
