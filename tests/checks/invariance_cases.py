"""Prompts of exact token lengths, with images, for the batch-invariance tests (CPU and GPU)."""

from __future__ import annotations

import numpy as np

from vlrl.messages import image_part

# Batch widths ≡ 1 mod 64 are where the SDPA stride-0 kernel bug returned a wrong last row on the H100
# (1025, 1409, 1857, 2049 measured wrong; 1408, 1410, 1710 right): the property draws them on purpose.
BAD_WIDTHS = (65, 257, 513, 1025, 1409, 1857)


def rgb(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def prompt_of_length(renderer, n_tokens: int, n_images: int, seed: int):
    """A one-turn user prompt of exactly ``n_tokens`` tokens with ``n_images`` small images (filler text);
    the shortest such prompt when ``n_tokens`` is below it (images and template take their own tokens)."""
    images = [image_part(rgb(56 + 28 * ((seed + k) % 3), 56 + 28 * (k % 2), seed * 7 + k)) for k in range(n_images)]

    def render(n_words: int):
        text = " ".join(f"w{(seed + i) % 97}" for i in range(n_words))
        return renderer.render([{"role": "user", "content": [*images, {"type": "text", "text": text or "hi"}]}])

    words = 1
    if len(shortest := render(1)) >= n_tokens:
        return shortest
    for _ in range(8):  # each filler word is ~2 tokens; converge on the exact length
        p = render(words)
        if len(p) == n_tokens:
            return p
        words = max(1, words + (n_tokens - len(p)) // 2 or (1 if len(p) < n_tokens else -1))
    return _trim_to(render(words), n_tokens, renderer)


def _trim_to(prompt, n_tokens: int, renderer):
    """Last resort: drop or add single filler tokens at the end of the text (never into the images,
    which come first) to hit the length exactly."""
    from vlrl.render.types import RenderedPrompt

    ids = list(prompt.token_ids)
    end = len(ids) - 5  # before "<|im_end|>\n<|im_start|>assistant\n"
    filler = renderer.tokenizer.convert_tokens_to_ids("w")
    while len(ids) > n_tokens:
        del ids[end - 1]
        end -= 1
    while len(ids) < n_tokens:
        ids.insert(end, filler)
    return RenderedPrompt(
        token_ids=tuple(ids),
        pixel_values=prompt.pixel_values,
        image_grid_thw=prompt.image_grid_thw,
        placeholders=prompt.placeholders,
        image_hashes=prompt.image_hashes,
        text="",
    )


_STACKS: dict[tuple, tuple] = {}  # (size, dtype, device, attention) -> (renderer, engine), until close_stacks()


def stack(size: str, dtype: str, device: str, attention: str | None = None):
    """(renderer, engine) for the tiny Qwen2.5-VL of ``size`` (tiny: one kv head; tiny_kv2: two), built once."""
    key = (size, dtype, device, attention)
    if key not in _STACKS:
        import torch

        from vlrl.engines.embedded import EmbeddedEngine
        from vlrl.models.build import cached_model_dir
        from vlrl.render.embedded import EmbeddedRenderer

        if device == "cuda":  # fp32 means fp32 (the trainer's own setting for CUDA runs)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        path = cached_model_dir("qwen2_5_vl", size, seed=0)
        engine = EmbeddedEngine.from_pretrained(path, device=device, dtype=getattr(torch, dtype), attention=attention)
        _STACKS[key] = (EmbeddedRenderer.from_pretrained(path), engine)
    return _STACKS[key]


def close_stacks() -> None:
    """Close every engine :func:`stack` built and forget them: a module's engines (a model and a prefix cache each)
    are not kept for the rest of the session."""
    for _, engine in _STACKS.values():
        engine.close()
    _STACKS.clear()
