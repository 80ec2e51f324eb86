"""Engine throughput on a fixed image workload: vlrl's embedded engine and plain HF ``generate``, same requests.

Each request: one 224×224 seeded random image + a short question (``workload``), ``max_tokens`` new
tokens, eos ignored, T = 1. Request ``i`` carries seed ``i`` in the engine; HF ``generate`` has one
generator per call (seeded once with ``torch.manual_seed(0)``), so its tokens differ, their count
does not. tok/s = generated tokens / wall seconds of the whole call (prefill included), best of
``repeats`` after a warm-up call of the same batch at 2 tokens (allocator and kernel caches), the two engines'
calls taking turns (:func:`alternating`). The embedded
engine's image and prefix caches are cleared before each call: every call starts cold, as HF generate does.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from vlrl.bench.env import now

IMAGE_SIZE = 224


def workload_images(n: int) -> list[Any]:
    """The ``n`` request images (uint8 ``[224, 224, 3]``, seeded): the same for every engine measured."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8) for _ in range(n)]


def workload_messages(n: int) -> list[list[dict]]:
    """One single-turn conversation per request: the image, then a question naming it."""
    from vlrl.messages import image_part, text_part

    return [
        [{"role": "user", "content": [image_part(img), text_part(f"Describe image {i}.")]}]
        for i, img in enumerate(workload_images(n))
    ]


def best_of(call: Callable[[], int], repeats: int, device: str) -> dict[str, float | int]:
    """Time ``call`` (returns the tokens it generated) ``repeats`` times; the fastest run's seconds and tok/s."""
    return alternating({"call": call}, repeats, device)["call"]


def alternating(calls: dict[str, Callable[[], int]], repeats: int, device: str) -> dict[str, dict[str, float | int]]:
    """Each of ``calls`` once per round, in turn, for ``repeats`` rounds; per call the fastest run's seconds and
    tok/s. Why in turn: both engines here are bound by the host, whose pace drifts over seconds on a shared
    machine; timing one engine's runs and then the other's compared two moments, not two engines."""
    best = {name: float("inf") for name in calls}
    tokens = dict.fromkeys(calls, 0)
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = now(device)
            tokens[name] = call()
            best[name] = min(best[name], now(device) - t0)
    out = {}
    for n in calls:
        out[n] = {"seconds": round(best[n], 4), "tokens": tokens[n], "tok_per_s": round(tokens[n] / best[n], 2)}
    return out


def embedded_call(engine, prompts: Sequence[Any]) -> Callable[[int], int]:
    """``call(tokens)``: vlrl's embedded engine on rendered ``prompts`` (one ``generate`` call: one batch of
    ``max_batch`` rows), each call from cold caches; returns the tokens it generated."""
    from vlrl.engines.types import SamplingParams

    def params(tokens: int) -> list[SamplingParams]:
        return [
            SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=i) for i in range(len(prompts))
        ]

    def call(tokens: int) -> int:
        engine.clear_caches()  # a cold start each call, as HF generate's: the same prompts again would hit the cache
        return sum(len(g.token_ids) for g in engine.generate(prompts, params(tokens)))

    return call


def hf_generate_call(model, processor, prompts: Sequence[Any], device: str) -> Callable[[int], int]:
    """``call(tokens)``: plain transformers ``model.generate`` on the same conversations as ``prompts``, left-padded,
    sampling at T = 1, no top-k / top-p, ``min_new_tokens = max_new_tokens`` (eos ignored); returns the tokens it
    generated. The inputs are processed and moved to ``device`` here, once, outside any timing."""
    processor.tokenizer.padding_side = "left"
    images = workload_images(len(prompts))
    inputs = processor(text=[p.text for p in prompts], images=images, return_tensors="pt", padding=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    width = inputs["input_ids"].shape[1]

    def call(tokens: int) -> int:
        kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        out = model.generate(**inputs, **kw)
        return int((out.shape[1] - width) * out.shape[0])

    return call


def engine_variants(device: str) -> dict[str, dict[str, Any]]:
    """The embedded engines timed beside ``embedded`` (the defaults), by name -> ``EmbeddedEngine`` keywords: on
    CUDA ``embedded_eager`` (no CUDA graphs: the A/B of ``vlrl.engines.graphs``) and, with Triton,
    ``embedded_counter`` (the sampler's race in one kernel: ``race="counter"``)."""
    import importlib.util

    variants: dict[str, dict[str, Any]] = {"embedded": {}}
    if device.startswith("cuda"):
        variants["embedded_eager"] = {"graphs": False}
        if importlib.util.find_spec("triton") is not None:
            variants["embedded_counter"] = {"race": "counter"}
    return variants


def engine_section(model, renderer, batch_sizes: Sequence[int], max_tokens: int, repeats: int, device: str) -> dict:
    """``{"embedded": {n: timing}, "hf_generate": {n: timing}, "embedded_over_hf": {n: ratio}}`` per batch size,
    and for each other variant of :func:`engine_variants` its timings and ``<name>_over_hf``, all timed in turn.
    A CUDA-graph engine captures its slots in the warm-up call (as vLLM captures at its start)."""
    import torch

    from vlrl.engines.embedded import EmbeddedEngine

    variants = engine_variants(device)
    size = max(batch_sizes)
    engines = {k: EmbeddedEngine(model, renderer.tokenizer, max_batch=size, **kw) for k, kw in variants.items()}
    out: dict[str, dict[str, Any]] = {"hf_generate": {}}
    for name in engines:
        out |= {name: {}, f"{name}_over_hf": {}}
    renderer.render(workload_messages(1)[0])  # first-call costs (template compile) are not the renderer's speed
    for n in batch_sizes:
        messages = workload_messages(n)
        t0 = time.perf_counter()
        prompts = [renderer.render(m) for m in messages]
        render_s = time.perf_counter() - t0
        key = str(n)
        torch.manual_seed(0)  # HF generate's one generator (module docstring)
        calls = {k: embedded_call(e, prompts) for k, e in engines.items()}
        calls["hf_generate"] = hf_generate_call(model, renderer.processor, prompts, device)
        for call in calls.values():
            call(2)  # warm-up
        timed = alternating({k: functools.partial(c, max_tokens) for k, c in calls.items()}, repeats, device)
        out["hf_generate"][key] = timed["hf_generate"]
        for name in engines:
            out[name][key] = timed[name]
            out[f"{name}_over_hf"][key] = round(timed[name]["tok_per_s"] / timed["hf_generate"]["tok_per_s"], 3)
        out["embedded"][key] |= {"render_seconds": round(render_s, 4)}
    for engine in engines.values():
        engine.close()
    return out
