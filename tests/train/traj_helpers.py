"""Helpers for the trainer tests: prompts, and single-turn Trajectory objects built from engine output.

tests/train is on sys.path (rootdir-relative test module import), so test modules ``import traj_helpers``.
"""

from __future__ import annotations

import numpy as np

from vlrl.engines.types import Generation, SamplingParams
from vlrl.messages import image_part
from vlrl.render.types import RenderedPrompt
from vlrl.rollout.types import Trajectory, TurnSpan


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def conversations(seed: int = 0) -> dict[str, list[dict]]:
    """A text-only, a single-image and a three-image conversation (the last with an assistant turn)."""
    single = [{"role": "user", "content": [image_part(rgb(90, 150, seed + 1)), {"type": "text", "text": "Colour?"}]}]
    multi = [
        {
            "role": "user",
            "content": [
                image_part(rgb(64, 64, seed + 2)),
                {"type": "text", "text": "vs"},
                image_part(rgb(112, 80, seed + 3)),
            ],
        },
        {"role": "assistant", "content": "hm"},
        {"role": "user", "content": [image_part(rgb(40, 120, seed + 4)), {"type": "text", "text": "and this?"}]},
    ]
    text = [{"role": "user", "content": "Say something."}]
    return {"single": single, "multi": multi, "text": text}


def same_shape_pair(seed: int = 0) -> list[list[dict]]:
    """Two single-image conversations whose images have the same size but different pixels."""
    return [
        [
            {
                "role": "user",
                "content": [image_part(rgb(84, 112, seed + 10 + i)), {"type": "text", "text": "What is shown?"}],
            }
        ]
        for i in range(2)
    ]


def trajectory(uid: str, prompt: RenderedPrompt, gen: Generation, temperature: float, group: int = 0) -> Trajectory:
    """A single-turn trajectory exactly as a rollout would record it: prompt tokens, generated tokens
    (loss mask 1, the engine's logprobs), the reward on the last generated token."""
    n = len(gen.token_ids)
    span = TurnSpan(
        index=0,
        obs_start=0,
        gen_start=len(prompt.token_ids),
        gen_end=len(prompt.token_ids) + n,
        reward=1.0,
        finish_reason=gen.finish_reason,
        eos_appended=False,
        text=gen.text,
        images_before=prompt.n_images,
    )
    return Trajectory(
        uid=uid,
        group=group,
        prompt_ids=tuple(prompt.token_ids),
        response_ids=tuple(gen.token_ids),
        loss_mask=(1,) * n,
        logprobs=tuple(gen.logprobs),
        rewards=(0.0,) * (n - 1) + (1.0,),
        pixel_values=prompt.pixel_values,
        image_grid_thw=prompt.image_grid_thw,
        placeholders=prompt.placeholders,
        image_hashes=prompt.image_hashes,
        turns=(span,),
        stop_reason="done",
        temperature=temperature,
    )


def rollout(
    bundle, convs: list[list[dict]], temperature: float, *, max_tokens: int = 16, topk: int = 0, seed: int = 7
) -> tuple[list[Trajectory], list[Generation]]:
    """Render ``convs``, generate them as one engine batch, return single-turn trajectories and generations."""
    prompts = [bundle.renderer.render(c) for c in convs]
    params = [
        SamplingParams(
            temperature=temperature, max_tokens=max_tokens, seed=seed + i, ignore_eos=True, logprobs_topk=topk
        )
        for i in range(len(prompts))
    ]
    gens = bundle.engine.generate(prompts, params)
    trajs = [trajectory(f"t{i}", p, g, temperature, group=i // 2) for i, (p, g) in enumerate(zip(prompts, gens))]
    return trajs, gens
