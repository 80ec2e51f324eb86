"""vLLM's execution modes on the bench workload, in one call: raw offline ``LLM.chat`` with vLLM's defaults, the
embedded engine, and vlrl's rollout path on servers started per mode (raw chat completions on the same server
timed in turn with it).

    python3 benchmarks/vllm_execution.py OUT.json --sizes 64,256 --max-tokens 128 --repeats 3 --modes graphs+mp,graphs

``--parts offline,inprocess`` times vlrl's in-process vLLM engine (``vlrl.vllm.inprocess``: embedded renderer,
token-in/token-out with the logprob contract) against raw offline in the same call, per ``--inprocess-modes``.
A mode is ``ServerConfig.execution`` (eager, graphs, compiled), ``+mp`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=1``
(on CUDA vLLM 0.26 the engine core had a process of its own either way), ``+apiN`` with N API processes
(``graphs+api4``), ``+badwords`` a server started for the ban as vLLM's ``bad_words`` (default: the processor;
the JSON records the form the engine found the server applies). The JSON is written after each part, so a command
cut by its clock keeps what it measured; ``--deadline-s`` (the caller's clock) cuts an offline or in-process child
first, keeping its numbers so far.
An in-process mode ``compiled+sampler`` runs the engine with ``logprobs_from="sampler"`` (each token's logprob kept
in vLLM's worker: ``vlrl.vllm.sampled_logprobs``), ``+badwords`` with ``ban="bad_words"`` (no custom logits
processor, so vLLM 0.26 may run its model runner V2 as raw offline does); ``compiled+sampler+badwords`` both;
``+defaults`` the in-process engine's defaults (the sampler, ``ban="auto"``; the child records the ban it chose).
``--parts offline_logprobs`` adds raw offline asking each sampled token's logprob as vlrl's path does (vLLM
carries them per request per step: ``benchmarks/vllm_logprob_wire.py``); in-process rows then carry
``over_offline_logprobs``.
The offline child compiles into the cache vlrl's engines use, so ``--inprocess-modes compiled`` after it starts warm:

    timeout 590 python3 benchmarks/vllm_execution.py OUT.json --parts offline,inprocess --inprocess-modes compiled \
        --sizes 64,256 --deadline-s 580
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlrl.bench import env
from vlrl.bench.vllm_offline import offline_section
from vlrl.bench.vllm_paths import SERVER_ARGS, fresh_batches, raw_runner, vlrl_runner


def server_mode(model_dir, mode: str, sizes, max_tokens: int, repeats: int, dtype: str) -> dict:
    """One server in ``mode``; per size a warm-up batch per path, then ``repeats`` rounds of raw and vlrl in turn."""
    from vlrl.vllm.stack import vllm_stack

    execution, *options = mode.split("+")
    api = [int(o[3:]) for o in options if o.startswith("api")]
    t0 = time.perf_counter()
    stack = vllm_stack(
        model_dir,
        max_images_per_prompt=1,
        extra_args=SERVER_ARGS,
        dtype=dtype,
        execution=execution,
        extra_env=(("VLLM_ENABLE_V1_MULTIPROCESSING", "1"),) if "mp" in options else (),
        api_servers=api[0] if api else 1,
        ban="bad_words" if "badwords" in options else "processor",
    )
    out: dict = {"startup_seconds": round(time.perf_counter() - t0, 2)}
    try:
        stack.renderer.render(fresh_batches(1, 1)[0][0])
        raw, vlrl = raw_runner(stack, max_tokens), vlrl_runner(stack, max_tokens)
        for n in sizes:
            batches = iter(fresh_batches(n, 2 * (1 + repeats)))
            raw(next(batches)), vlrl(next(batches))  # warm-ups, on images of their own
            rounds = []
            for _ in range(repeats):
                row = {}
                for name, run in (("raw", raw), ("vlrl", vlrl)):
                    t = time.perf_counter()
                    tokens = run(next(batches))
                    row[name] = {"seconds": round(time.perf_counter() - t, 4), "tokens": tokens}
                row["vlrl_over_raw"] = round(row["raw"]["seconds"] / row["vlrl"]["seconds"], 3)
                rounds.append(row)
            out[str(n)] = {
                "rounds": rounds,
                "raw_best_tok_per_s": round(max(r["raw"]["tokens"] / r["raw"]["seconds"] for r in rounds), 2),
                "vlrl_best_tok_per_s": round(max(r["vlrl"]["tokens"] / r["vlrl"]["seconds"] for r in rounds), 2),
                "vlrl_over_raw_median": statistics.median(r["vlrl_over_raw"] for r in rounds),
            }
        out["ban"] = stack.engine.ban
    finally:
        stack.close()
    return out


def embedded(model_dir, sizes, max_tokens: int, repeats: int, dtype: str) -> dict:
    """``vlrl bench``'s engine section (embedded engine variants and HF generate, in turn) at ``sizes``."""
    import torch

    from vlrl.bench.engines import engine_section
    from vlrl.models.load import load_model
    from vlrl.render.embedded import EmbeddedRenderer

    model = load_model(model_dir, dtype=getattr(torch, dtype), device="cuda")
    renderer = EmbeddedRenderer.from_pretrained(model_dir)
    try:
        return engine_section(model, renderer, sizes, max_tokens, repeats, "cuda")
    finally:
        del model
        torch.cuda.empty_cache()


def engine_options(options: list[str]) -> dict[str, str]:
    """An in-process mode's options (``compiled+sampler+badwords``: ``["sampler", "badwords"]``) as the engine's."""
    if "defaults" in options:
        return {"logprobs_from": "sampler", "ban": "auto"}
    return {
        "logprobs_from": "sampler" if "sampler" in options else "vllm",
        "ban": "bad_words" if "badwords" in options else "processor",
    }


def parser() -> argparse.ArgumentParser:
    """The command line (the JSON's path, the workload, the parts and their modes, the caller's clock)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--modes", default="graphs+mp,graphs")
    parser.add_argument(
        "--parts", default="offline,embedded,modes", help="which parts (+ inprocess, offline_logprobs), in order"
    )
    parser.add_argument("--inprocess-modes", default="graphs", help="the inprocess part's execution modes")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="seconds for the whole command: each offline/inprocess child is cut (keeping what it measured) before "
        "then, instead of the caller's clock killing this process with the child's numbers unread",
    )
    return parser


def _inprocess(result: dict, model_dir, sizes, args: argparse.Namespace, child_clock, save) -> None:
    """vlrl's in-process vLLM engine (``vlrl.vllm.inprocess``), one child per ``--inprocess-modes`` mode, into
    ``result`` (with its ``over_offline``), saved after each."""
    for mode in args.inprocess_modes.split(","):
        execution, *options = mode.split("+")
        result[f"inprocess_{mode}"] = offline_section(
            model_dir,
            sizes,
            args.max_tokens,
            args.repeats,
            args.dtype,
            path="vlrl",
            execution=execution,
            **engine_options(options),
            **child_clock(),
        )
        over_offline(result)
        save()


def _server_modes(result: dict, model_dir, sizes, args: argparse.Namespace, save) -> None:
    """:func:`server_mode` per ``--modes`` mode into ``result``, saved after each; a mode's error is recorded."""
    for mode in args.modes.split(","):
        try:
            result[f"server_{mode}"] = server_mode(model_dir, mode, sizes, args.max_tokens, args.repeats, args.dtype)
        except Exception as exc:  # noqa: BLE001 — recorded, the next mode still runs
            result[f"server_{mode}"] = {"error": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
        save()


def _run_part(part: str, result: dict, model_dir, sizes, args: argparse.Namespace, child_clock, save) -> None:
    """One of ``--parts`` into ``result`` (``child_clock()``: an offline/inprocess child's timeout argument;
    ``save()``: writes the JSON)."""
    if part in ("offline", "offline_logprobs"):  # the second asks each token's logprob, as vlrl's path does
        path = "raw_logprobs" if part == "offline_logprobs" else "raw"
        result[part] = offline_section(
            model_dir, sizes, args.max_tokens, args.repeats, args.dtype, path=path, **child_clock()
        )
    elif part == "inprocess":  # vlrl's in-process vLLM engine, one child per mode (vlrl.vllm.inprocess)
        _inprocess(result, model_dir, sizes, args, child_clock, save)
    elif part == "embedded":
        result["embedded"] = embedded(model_dir, sizes, args.max_tokens, args.repeats, args.dtype)
    elif part == "modes":
        _server_modes(result, model_dir, sizes, args, save)


def main() -> int:
    args = parser().parse_args()
    t_start = time.perf_counter()

    def child_clock() -> dict:
        if args.deadline_s is None:
            return {}
        return {"timeout_s": max(30.0, min(480.0, args.deadline_s - (time.perf_counter() - t_start) - 15))}

    from vlrl.models.build import cached_model_dir

    sizes = [int(x) for x in args.sizes.split(",")]
    model_dir = cached_model_dir("qwen2_5_vl", "2b")
    result: dict = {
        "benchmark": "benchmarks/vllm_execution.py",
        "config": vars(args),
        "git": env.git_commit(),
        "device_name": env.device_name("cuda"),
        "versions": env.versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"saved after {list(result)[-1]}", file=sys.stderr, flush=True)

    for part in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            _run_part(part, result, model_dir, sizes, args, child_clock, save)
        except Exception as exc:  # noqa: BLE001 — recorded, the other parts still run
            result[f"{part}_error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:1500]}"
        result[f"{part}_wall_seconds"] = round(time.perf_counter() - t0, 1)
        over_offline(result)  # whichever part ran first
        save()
    return 0


def over_offline(result: dict) -> None:
    """Each in-process size's ``over_offline`` (``over_offline_logprobs``): its tok/s over raw offline's (raw offline
    asking each token's logprob) at that size, where both ran."""
    for key, r in result.items():
        if not key.startswith("inprocess_") or not isinstance(r, dict):
            continue
        for n, t in r.items():
            for ref in ("offline", "offline_logprobs"):
                base = result.get(ref, {}).get(n, {})
                if isinstance(t, dict) and "tok_per_s" in t and "tok_per_s" in base:
                    t[f"over_{ref}"] = round(t["tok_per_s"] / base["tok_per_s"], 3)


if __name__ == "__main__":
    raise SystemExit(main())
