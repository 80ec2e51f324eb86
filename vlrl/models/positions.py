"""mRoPE position ids, computed one way for the engine and the trainer alike."""

from __future__ import annotations

import torch

IMAGE, VIDEO = 1, 2


def mm_token_type_ids(input_ids: torch.Tensor, image_token_id: int, video_token_id: int) -> torch.Tensor:
    """``[B, L]`` int: 0 text, 1 image placeholder, 2 video placeholder."""
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[input_ids == image_token_id] = IMAGE
    types[input_ids == video_token_id] = VIDEO
    return types


def mrope_positions(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, image_grid_thw: torch.Tensor | None
) -> torch.Tensor:
    """``[3, B, L]`` (temporal, height, width) position ids from the image grids, as the model
    computes them, on ``input_ids``' device. Padding positions (``attention_mask == 0``) get 0.

    ``model`` is a Qwen-VL ``*ForConditionalGeneration``; ``input_ids`` ``[B, L]``.

    Computed from CPU copies: the model's ``get_rope_index`` walks the rows and their images in Python, reading
    a grid's values, a row's mask and its maximum one at a time, and on CUDA tensors each read is a host sync
    (on the H200, ``vlrl bench``'s train step made 716 syncs; benchmarks/results/train_profile/). Integer
    arithmetic: the same ids on either device; one copy to the device at the end.
    """
    cfg = model.config
    device = input_ids.device
    ids = input_ids.cpu()
    attn, grid = (None if t is None else t.cpu() for t in (attention_mask, image_grid_thw))
    types = mm_token_type_ids(ids, cfg.image_token_id, cfg.video_token_id)
    positions, _ = model.model.get_rope_index(ids, types, image_grid_thw=grid, attention_mask=attn)
    return positions.to(device)
