"""Raw vLLM offline: ``LLM.chat`` on the bench workload with vLLM's own defaults, in a child process.

The reference the vLLM-on-GPU issue measures vlrl's rollout path against ("raw vLLM offline generate"): what a
plain vLLM user gets from ``vllm.LLM`` — torch.compile and CUDA graphs as vLLM chooses them, the image as a data
URI that vLLM processes itself, all of a batch's conversations in one call, ``ignore_eos``, T = 1, seed ``i``.
Only memory is set, because the bench's own process already holds the policy: the KV cache to ``kv_cache_gib``
and the start-up check's fraction to ``gpu_memory_utilization``.

``--path raw_logprobs`` is the same raw ``LLM.chat`` asking each sampled token's logprob as vlrl does
(``logprobs=0``, ``detokenize=False``): what vLLM's own per-token logprob transport costs a plain user
(``benchmarks/vllm_logprob_wire.py``), the reference that asks vLLM for what vlrl's path asks.

``--path vlrl`` times vlrl's in-process vLLM engine (``vlrl.vllm.inprocess``) in the same way, the path a run takes
with ``rollout.vllm_mode=inprocess``: each conversation rendered by the embedded renderer (threads), then generated
token-in/token-out under the logprob contract with the prompt's own tensors, all of a batch concurrently; the
engine's settings are a run's (``ServerConfig``: processed logprobs, the vision-token ban, the run's execution mode).

A child process because an ``LLM`` keeps its GPU memory and its engine process until its interpreter exits; the
server the bench starts next needs the memory back. Each batch is warmed up once on images of its own and timed
on fresh ones, as :mod:`vlrl.bench.vllm_paths` times its paths.

    python -m vlrl.bench.vllm_offline MODEL_DIR --out R.json --dtype bfloat16 --batch-sizes 64,256 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def offline_section(
    model_dir: str | Path,
    batch_sizes: Sequence[int],
    max_tokens: int,
    repeats: int,
    dtype: str,
    *,
    kv_cache_gib: int = 16,
    gpu_memory_utilization: float = 0.3,
    timeout_s: float = 480.0,
    path: str = "raw",
    execution: str = "auto",
    logprobs_from: str = "vllm",
    ban: str = "processor",
) -> dict[str, Any]:
    """``{"startup_seconds", "version", "<n>": {"seconds", "tokens", "tok_per_s"} | {"error"}}`` from
    the child (written after each batch size, so a child cut by ``timeout_s`` keeps what it measured), or
    ``{"error": ..., "log_tail": ...}`` naming why it gave nothing. The child runs in a session of its own, killed
    whole on the timeout: vLLM's engine process would otherwise outlive it, holding the GPU."""
    from vlrl.models.build import default_cache_root
    from vlrl.vllm.capabilities import vllm_python

    # the compile cache every engine vlrl starts uses (ServerConfig.cache_root): an in-process engine with the same
    # settings (`--path vlrl --execution compiled`) starts on what this child compiled, not cold again (~200 s, 2b)
    cache = default_cache_root() / "vllm"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = [vllm_python(), "-m", "vlrl.bench.vllm_offline", str(model_dir), "--out", str(out), "--dtype", dtype]
        argv += ["--batch-sizes", ",".join(map(str, batch_sizes)), "--max-tokens", str(max_tokens)]
        argv += ["--repeats", str(repeats), "--kv-cache-gib", str(kv_cache_gib)]
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization), "--path", path, "--execution", execution]
        argv += ["--logprobs-from", logprobs_from, "--ban", ban]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        env.update({"VLLM_CACHE_ROOT": str(cache / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")})
        log = Path(tmp) / "child.log"
        with open(log, "wb") as sink:
            child = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                code: int | str = child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                code = f"killed after {timeout_s:.0f} s"
        result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
        if code != 0 or not result:
            result["error"] = f"the child ended ({code}) with {len(result)} result fields"
            result["log_tail"] = log.read_text(errors="replace")[-2000:]
        return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The child's work: start one ``LLM``, then per batch size a warm-up batch and ``repeats`` timed ones."""
    import vllm
    from vllm import LLM, SamplingParams

    from vlrl.vllm.capabilities import model_runner_v2

    if args.path == "vlrl":
        return measure_vlrl(args)
    extras: dict[str, Any] = {"logprobs": 0, "detokenize": False} if args.path == "raw_logprobs" else {}
    t0 = time.perf_counter()
    llm = LLM(
        model=args.model_dir,
        dtype=args.dtype,
        limit_mm_per_prompt={"image": 1, "video": 0},
        kv_cache_memory_bytes=args.kv_cache_gib * 2**30,
        gpu_memory_utilization=args.gpu_memory_utilization,
        seed=0,
    )
    out: dict[str, Any] = {"startup_seconds": round(time.perf_counter() - t0, 2), "version": vllm.__version__}
    out["model_runner_v2"] = model_runner_v2(llm)  # vLLM 0.26 on CUDA: V2 here, V1 with vlrl's logits processor
    Path(args.out).write_text(json.dumps(out))

    def run(batch: list[list[Any]]) -> int:
        params = [
            SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=i, **extras)
            for i in range(len(batch))
        ]
        outputs = llm.chat(batch, sampling_params=params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    return time_batches(run, args, out)


def time_batches(run, args: argparse.Namespace, out: dict[str, Any]) -> dict[str, Any]:
    """Per batch size a warm-up batch and ``repeats`` timed ones, ``out`` rewritten after each."""
    from vlrl.bench.vllm_paths import fresh_batches, timed

    for n in args.batch_sizes:
        try:
            out[str(n)] = timed(run, fresh_batches(n, 1 + args.repeats))  # the protocol of the server paths
        except Exception as exc:  # noqa: BLE001 — recorded per batch size, the others still run
            out[str(n)] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}
        Path(args.out).write_text(json.dumps(out))
    return out


def measure_vlrl(args: argparse.Namespace) -> dict[str, Any]:
    """``--path vlrl``: the in-process engine with a run's settings and the embedded renderer (module docstring)."""
    import asyncio

    import vllm

    from vlrl.checks.render_agreement import check_render_agreement
    from vlrl.engines.types import SamplingParams
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.vllm.capabilities import model_runner_v2
    from vlrl.vllm.config import ServerConfig
    from vlrl.vllm.inprocess import InprocessVllmEngine
    from vlrl.vllm.items import codec_probe
    from vlrl.vllm.stack import RENDER_WORKERS

    t0 = time.perf_counter()
    config = ServerConfig(
        args.model_dir,
        dtype=args.dtype,
        max_images_per_prompt=1,
        kv_cache_gib=args.kv_cache_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        execution=args.execution,
    )
    engine = InprocessVllmEngine(config, logprobs_from=args.logprobs_from, ban=args.ban)
    renderer = EmbeddedRenderer.from_pretrained(args.model_dir, workers=min(RENDER_WORKERS, os.cpu_count() or 1))
    agree = check_render_agreement(renderer, engine.renderer, codec_probe(), pixel_dtype=engine.codec.pixel_dtype)
    out: dict[str, Any] = {
        "startup_seconds": round(time.perf_counter() - t0, 2),
        "version": vllm.__version__,
        "model_runner_v2": model_runner_v2(engine.llm),
        "execution": args.execution,
        "logprobs_from": args.logprobs_from,
        "ban": engine.ban,  # as started (``auto`` resolved)
        "render_agreement_pixel_max_abs": agree.pixel_max_abs,
    }
    Path(args.out).write_text(json.dumps(out))

    async def one(i: int, msgs: list) -> int:
        prompt = await renderer.arender(msgs)
        sp = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=i)
        return len((await engine.agenerate(prompt, sp)).token_ids)

    async def all_of(batch: list) -> int:
        return sum(await asyncio.gather(*(one(i, m) for i, m in enumerate(batch))))

    try:
        return time_batches(lambda b: asyncio.run(all_of(b)), args, out)
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vlrl.bench.vllm_offline", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--out", required=True, help="JSON result, rewritten after each batch size")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-gib", type=int, default=16)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument(
        "--path",
        choices=("raw", "raw_logprobs", "vlrl"),
        default="raw",
        help="raw LLM.chat, the same asking each token's logprob, or vlrl in-process",
    )
    parser.add_argument("--execution", default="auto", help="--path vlrl: ServerConfig.execution")
    parser.add_argument("--logprobs-from", choices=("vllm", "sampler"), default="vllm", help="--path vlrl")
    parser.add_argument("--ban", choices=("auto", "processor", "bad_words"), default="processor", help="--path vlrl")
    measure(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
