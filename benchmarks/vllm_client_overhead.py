"""The vLLM engine's client cost per request, with the server taken out: a stub that answers every generate at once.

``VllmEngine.agenerate`` of ``N`` bench prompts (a 224 px image + question, rendered beforehand by the embedded
renderer, fresh images each batch, so every item is built and sent whole), all in flight at once, against a local
uvicorn app that reads the body and returns a fixed 64-token answer; then the same for text-only prompts, and the
already-serialised bodies posted with ``VllmClient.post``. Each case for the HTTP library the client picks
(``vlrl.vllm.client._httpx``: httpx2 where installed) and for plain ``httpx``, alternated twice (the best kept).
JSON to OUT:

    python benchmarks/vllm_client_overhead.py OUT.json [N]
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from unittest import mock

STUB = r"""
import json, sys
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
app = FastAPI()
N = 64
content = [{"token": f"token_id:{100 + i}", "logprob": -1.0, "bytes": None, "top_logprobs": []} for i in range(N)]
ANSWER = json.dumps({"choices": [{"index": 0, "token_ids": [100 + i for i in range(N)], "finish_reason": "length",
                                  "logprobs": {"content": content}}]}).encode()
@app.post("/inference/v1/generate")
async def generate(request: Request):
    await request.body()
    return Response(ANSWER, media_type="application/json")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_for(model_dir, url: str):
    import torch
    from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import encode_mm_kwargs_item
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFieldElem,
        MultiModalFlatField,
        MultiModalKwargsItem,
    )

    from vlrl.vllm.capabilities import VllmCapabilities
    from vlrl.vllm.engine import VllmEngine
    from vlrl.vllm.items import ItemCodec

    engine = VllmEngine.from_pretrained(model_dir, url)
    engine.client._caps = VllmCapabilities("0.26.0", "cuda", None)  # the stub speaks 0.26's wire shapes
    template = MultiModalKwargsItem(  # the layout CUDA vLLM 0.26 renders for Qwen2.5-VL in bf16
        {
            "pixel_values": MultiModalFieldElem(
                torch.zeros(4, 1176, dtype=torch.bfloat16), MultiModalFlatField(slices=[[slice(0, 4)]], dim=0)
            ),
            "image_grid_thw": MultiModalFieldElem(torch.tensor([1, 2, 2]), MultiModalBatchedField(keep_on_cpu=True)),
        }
    )
    engine.item_codec = ItemCodec(encode_mm_kwargs_item(template))
    engine.ban = "processor"  # the stub is not vLLM: it answers without sampling, so the ban probe has nothing to see
    return engine


def measure(model_dir, url: str, n: int, repeats: int) -> dict:
    from vlrl.bench.engines import workload_messages
    from vlrl.engines.types import SamplingParams
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.vllm.client import GENERATE
    from vlrl.vllm.items import wire

    renderer, engine = EmbeddedRenderer.from_pretrained(model_dir), engine_for(model_dir, url)
    sp = [SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, seed=i) for i in range(n)]
    pool = workload_messages(n * (repeats + 1))

    def run(prompts) -> float:
        async def all_of():
            await asyncio.gather(*(engine.agenerate(p, s) for p, s in zip(prompts, sp)))

        t = time.perf_counter()
        asyncio.run(all_of())
        return time.perf_counter() - t

    batches = [[renderer.render(m) for m in pool[k * n : (k + 1) * n]] for k in range(repeats + 1)]
    run(batches[0])  # warm-up: connections opened
    images = min(run(b) for b in batches[1:])
    text = min(run([renderer.render([{"role": "user", "content": f"q {i} {k}"}]) for i in range(n)]) for k in range(2))
    bodies = [wire(engine.request_body(p, s, engine.item_codec)) for p, s in zip(batches[-1], sp)]

    async def posts():
        await asyncio.gather(*(engine.client.post(url, GENERATE, b, what="stub") for b in bodies))

    t = time.perf_counter()
    engine.client.run(posts())
    posted = time.perf_counter() - t
    engine.close()
    ms = lambda s: round(1000 * s / n, 2)  # noqa: E731
    return {
        "agenerate_images_s": round(images, 3),
        "per_request_ms": ms(images),
        "text_only_per_request_ms": ms(text),
        "posts_of_serialised_bodies_per_request_ms": ms(posted),
        "body_bytes": len(json.dumps(bodies[0])),
    }


def main() -> None:
    from vlrl.bench.env import git_commit, host, versions
    from vlrl.models.build import cached_model_dir

    out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 64
    model_dir = cached_model_dir("qwen2_5_vl", "tiny")
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(3)
        import httpx

        from vlrl.vllm import client

        result = {"commit": git_commit(), "host": host(), "versions": versions(), "requests": n, "by_library": {}}
        picked = client._httpx().__name__ + " (picked)"
        rounds: dict[str, list[dict]] = {picked: [], "httpx": []}
        for _ in range(2):  # alternated, the best of each kept: the stub and the client share this machine's cores
            rounds[picked].append(measure(model_dir, url, n, 3))
            with mock.patch.object(client, "_httpx", lambda: httpx):
                rounds["httpx"].append(measure(model_dir, url, n, 3))
        for name, runs in rounds.items():
            result["by_library"][name] = {k: min(r[k] for r in runs) for k in runs[0]}
        print(json.dumps(result["by_library"], indent=1))
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    finally:
        stub.terminate()


if __name__ == "__main__":
    main()
