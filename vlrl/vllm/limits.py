"""A server's limits from the run: context from the model, images per prompt from the env.

vLLM's own defaults (and vlrl's old fixed 4 images / 4,096 tokens) cut episodes short that the
embedded engine plays to the end: a maze2d prompt with a 5th image was refused by the server and
the episode ended with ``env_error``. So every limit is derived, or given explicitly and checked:

- ``max_model_len``: the model's ``max_position_embeddings`` (the embedded engine's context);
- ``max_images_per_prompt``: what the run's env can put in one prompt (:func:`episode_images`), or
  by default every image the context can hold at the processor's smallest image size;
- ``kv_cache_gib``: room for at least one full-context sequence (vLLM refuses to start with less).

A limit that cannot fit is refused before any server starts, with the numbers, as one
:class:`VllmLimitError`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlrl.errors import VlrlError

GIB = 1 << 30
SERVER_DTYPE_BYTES = 4
"""The server runs ``--dtype float32`` (see ``vlrl.vllm.server``): 4 bytes per KV element."""


class VllmLimitError(VlrlError, ValueError):
    """A vLLM server limit (context, images per prompt, KV cache) that the model or run cannot fit."""


@dataclass(frozen=True)
class ModelLimits:
    """What a checkpoint directory allows, read from its config files (no torch, no transformers)."""

    max_position_embeddings: int
    min_image_tokens: int
    """Placeholder tokens of the smallest image the processor makes (its ``min_pixels``)."""
    max_image_tokens: int
    """Placeholder tokens of the largest image the processor makes (its ``max_pixels``)."""
    kv_bytes_per_token: int
    """K and V over every layer, at the server's dtype."""


@dataclass(frozen=True)
class ServerLimits:
    max_model_len: int
    max_images_per_prompt: int
    kv_cache_gib: int


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def model_limits(model_dir: str | os.PathLike) -> ModelLimits:
    """Read ``config.json`` and the image processor's config of a Qwen-VL checkpoint directory."""
    root = Path(model_dir)
    if not (root / "config.json").exists():
        raise VllmLimitError(f"{root} is not a checkpoint directory (no config.json)")
    cfg = _read_json(root / "config.json")
    text = cfg.get("text_config") or cfg
    try:
        positions = int(text["max_position_embeddings"])
        layers = int(text["num_hidden_layers"])
        kv_heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise VllmLimitError(f"{root / 'config.json'}: cannot read the text model's shape ({exc!r})") from None
    proc = _read_json(root / "processor_config.json").get("image_processor") or _read_json(
        root / "preprocessor_config.json"
    )  # ours / a downloaded Qwen-VL checkpoint's
    size = proc.get("size") or {}
    factor = int(proc.get("patch_size", 14)) * int(proc.get("merge_size", 2))
    min_pixels = int(size.get("shortest_edge") or proc.get("min_pixels") or factor * factor)
    max_pixels = int(size.get("longest_edge") or proc.get("max_pixels") or 0)
    max_tokens = math.ceil(max_pixels / factor**2) + 2 if max_pixels else 1  # + vision start / end
    return ModelLimits(
        max_position_embeddings=positions,
        min_image_tokens=max(1, math.ceil(min_pixels / factor**2)),
        max_image_tokens=max_tokens,
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * SERVER_DTYPE_BYTES,
    )


def resolve_limits(
    model_dir: str | os.PathLike,
    *,
    max_model_len: int | None = None,
    max_images_per_prompt: int | None = None,
    kv_cache_gib: int | None = None,
) -> ServerLimits:
    """Fill in what is not given (see the module docstring); raise :class:`VllmLimitError` when a limit cannot fit."""
    m = model_limits(model_dir)
    ctx = m.max_position_embeddings if max_model_len is None else int(max_model_len)
    if not 1 <= ctx <= m.max_position_embeddings:
        raise VllmLimitError(
            f"max_model_len {ctx} does not fit the model: it must be 1..{m.max_position_embeddings} "
            f"(max_position_embeddings of {model_dir})"
        )
    if m.max_image_tokens > ctx:
        raise VllmLimitError(
            f"max_model_len {ctx} cannot hold one image at the processor's max_pixels ({m.max_image_tokens} tokens)"
        )
    most = ctx // m.min_image_tokens
    images = most if max_images_per_prompt is None else int(max_images_per_prompt)
    if not 1 <= images <= most:
        raise VllmLimitError(
            f"max_images_per_prompt {images} cannot fit: a {ctx}-token context holds 1..{most} "
            f"images ({m.min_image_tokens} tokens each at the processor's min_pixels)"
        )
    need = math.ceil(m.kv_bytes_per_token * ctx * 1.1 / GIB)  # + block rounding and vLLM's own slack
    kv = max(1, need) if kv_cache_gib is None else int(kv_cache_gib)
    if kv < need:
        raise VllmLimitError(
            f"kv_cache_gib {kv} cannot hold one {ctx}-token sequence "
            f"({m.kv_bytes_per_token} bytes per token: {need} GiB needed)"
        )
    return ServerLimits(max_model_len=ctx, max_images_per_prompt=images, kv_cache_gib=kv)


def episode_images(env_class: str, extras: Mapping[str, Any] | None = None, max_turns: int | None = None) -> int:
    """The most images one episode of ``env_class`` puts in a prompt: its first observation's images on
    every turn of the budget (``max_turns``, capped by the env's own, as the rollout does). At least 1:
    the weight-sync probe sends one image."""
    from vlrl.envs.contract import PLACEHOLDER_PROMPT
    from vlrl.envs.registry import make_env
    from vlrl.messages import IMAGE_PART_TYPES

    env = make_env(env_class, extras, 0)
    try:
        messages, _ = env.init([dict(m) for m in PLACEHOLDER_PROMPT])
        turns = env.max_turns if max_turns is None else min(int(max_turns), env.max_turns)
    finally:
        env.close()
    per_turn = sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES
    )
    return max(1, per_turn * max(1, turns))
