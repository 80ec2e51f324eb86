"""Load a checkpoint directory: one of ours, or a real downloaded Qwen-VL one, unchanged."""

from __future__ import annotations

import os
from typing import get_args

# vLLM normalises and resizes with torchvision; transformers' PIL backend resizes differently
# (up to ~7e-4 in logprobs on resized images), so vlrl always uses the torchvision backend.
IMAGE_PROCESSOR_BACKEND = "Qwen2VLImageProcessor"


def load_processor(path: str | os.PathLike):
    """``AutoProcessor`` for ``path``, checked to use the torchvision image-processor backend."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(path))
    name = type(processor.image_processor).__name__
    if name != IMAGE_PROCESSOR_BACKEND:
        raise RuntimeError(
            f"{path}: image processor is {name}, expected the torchvision backend "
            f"{IMAGE_PROCESSOR_BACKEND} (vLLM's); install torchvision"
        )
    return processor


def load_model(
    path: str | os.PathLike, dtype=None, device: str = "cpu", attention: str | None = None, kernels: str = "eager"
):
    """``AutoModelForImageTextToText`` for ``path`` in eval mode (fp32 unless ``dtype``).

    ``attention`` defaults to vlrl's own SDPA function (``vlrl.models.attention``: materialised kv
    heads, immune to the stride-0 kernel bug documented there); ``"sdpa"`` / ``"eager"`` for diagnosis.
    ``kernels="fused"`` routes RMSNorm, SwiGLU and rotary through compiled kernels for half-precision CUDA inputs
    (``vlrl.models.fused``, opt-in: see its measurements; nothing changes on CPU or in fp32); ``"eager"`` (the
    default) keeps transformers' own.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    from vlrl.models import fused
    from vlrl.models.attention import ATTENTION, CHOICES, VISION

    attention = attention or ATTENTION
    if attention not in CHOICES:
        raise ValueError(f"attention must be one of {', '.join(CHOICES)}, got {attention!r}")
    if kernels not in get_args(fused.Kernels):
        raise ValueError(f"kernels must be one of {', '.join(get_args(fused.Kernels))}, got {kernels!r}")
    model = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=dtype or torch.float32, attn_implementation=attention
    )
    vision = getattr(model.config, "vision_config", None)
    if attention == ATTENTION and vision is not None:
        # Set after loading: a "flash" name given to from_pretrained would be checked for flash-attn itself.
        vision._attn_implementation = VISION  # all images in one call (vlrl.models.attention)
    if kernels == "fused":
        fused.install(model)
    # transformers' decorator on PreTrainedModel.to types it as taking the model as first argument
    return model.to(device).eval()  # type: ignore[arg-type]
