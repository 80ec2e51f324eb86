"""Embedded-engine decode throughput at 1, 8 and 64 concurrent sequences; writes JSON.

    python benchmarks/engine_throughput.py --size tiny --device cpu --out benchmarks/results/engine_cpu_tiny.json
    python benchmarks/engine_throughput.py --size 2b --device cuda --dtype bfloat16 --baseline \
        --out benchmarks/results/engine_gpu_2b.json

Each request: one 224×224 image + a short question, ``max_tokens`` new tokens, eos ignored, T=1,
its own seed. tok/s = generated tokens / wall seconds of the whole ``generate`` call (prefill
included), best of ``--repeats`` after one warm-up. ``--baseline`` also times plain
``transformers`` ``model.generate`` (sampling, same batch, left-padded) for comparison.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch


def build(args):
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.models.build import build_model, build_processor
    from vlrl.render.embedded import EmbeddedRenderer

    dtype = getattr(torch, args.dtype)
    model = build_model(args.arch, args.size, seed=0, dtype=dtype, device=args.device)
    processor = build_processor(args.arch, args.size)
    return EmbeddedRenderer(processor), EmbeddedEngine(model, processor.tokenizer, max_batch=max(args.concurrency))


def make_prompts(renderer, n: int):
    from vlrl.messages import image_part

    out = []
    for i, img in enumerate(bench_images(n)):
        msgs = [{"role": "user", "content": [image_part(img), {"type": "text", "text": f"Describe image {i}."}]}]
        out.append(renderer.render(msgs))
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_engine(engine, prompts, max_tokens: int, repeats: int, device: str) -> dict:
    from vlrl.engines.types import SamplingParams

    params = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i) for i in range(len(prompts))
    ]
    engine.generate(prompts, params)  # warm-up
    best = None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        sync(device)
        dt = time.perf_counter() - t0
        n = sum(len(g.token_ids) for g in gens)
        best = dt if best is None or dt < best else best
    return {"seconds": round(best, 4), "tokens": n, "tok_per_s": round(n / best, 2)}


def time_hf_generate(engine, renderer, prompts, max_tokens: int, repeats: int, device: str) -> dict:
    """Plain transformers generate on the same batch: the baseline to beat."""
    tok = renderer.tokenizer
    tok.padding_side = "left"
    texts = [p.text for p in prompts]
    inputs = renderer.processor(text=texts, images=bench_images(len(prompts)), return_tensors="pt", padding=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(engine.model.dtype)
    kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    engine.model.generate(**inputs, **kw)
    best = None
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = engine.model.generate(**inputs, **kw)
        sync(device)
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
    n = (out.shape[1] - inputs["input_ids"].shape[1]) * out.shape[0]
    return {"seconds": round(best, 4), "tokens": int(n), "tok_per_s": round(n / best, 2)}


def bench_images(n: int) -> list[np.ndarray]:
    """The n 224×224 request images (seeded), shared by the engine and the HF-generate baseline."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="qwen2_5_vl")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--baseline", action="store_true", help="also time transformers' model.generate")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    renderer, engine = build(args)
    results = {
        "arch": args.arch,
        "size": args.size,
        "device": args.device,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "torch": torch.__version__,
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "cpu_threads": torch.get_num_threads(),
        "engine": {},
        "hf_generate": {},
    }
    import transformers

    results["transformers"] = transformers.__version__
    for c in args.concurrency:
        prompts = make_prompts(renderer, c)
        results["engine"][str(c)] = time_engine(engine, prompts, args.max_tokens, args.repeats, args.device)
        if args.baseline:
            results["hf_generate"][str(c)] = time_hf_generate(
                engine, renderer, prompts, args.max_tokens, args.repeats, args.device
            )
        print(c, results["engine"][str(c)], results["hf_generate"].get(str(c)), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
