"""The three Qwen-VL architectures vlrl builds, and their named sizes.

Plain data (no torch): a size is a set of text / vision hyper-parameters; an architecture says
how to spell them in its transformers config and which image-processor settings it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# OpenAI CLIP statistics (Qwen2-VL, Qwen2.5-VL) and the 0.5/0.5 of Qwen3-VL.
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Size:
    """Hyper-parameters of one named size. ``head_dim = hidden // heads`` for the text model."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    min_pixels: int
    max_pixels: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SIZES: dict[str, Size] = {
    # A few M params beyond the 151,936-row embedding; head_dim 32 (CPU attention kernels support it).
    "tiny": Size(
        hidden=64,
        intermediate=128,
        layers=2,
        heads=2,
        kv_heads=1,
        vision_depth=2,
        vision_hidden=64,
        vision_intermediate=128,
        vision_heads=2,
        min_pixels=56 * 56,
        max_pixels=224 * 224,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    # tiny with grouped-query attention (4 heads over 2 kv heads, as the 2b model groups 12 over 2): the
    # batch-invariance property runs on both kv layouts (one kv head is what exposed the SDPA stride-0 bug).
    "tiny_kv2": Size(
        hidden=128,
        intermediate=256,
        layers=2,
        heads=4,
        kv_heads=2,
        vision_depth=2,
        vision_hidden=64,
        vision_intermediate=128,
        vision_heads=2,
        min_pixels=56 * 56,
        max_pixels=224 * 224,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    # The GPU benchmark model: ≈2.2 B params, Qwen2-VL-2B-like shapes with a 32-block vision tower.
    "2b": Size(
        hidden=1536,
        intermediate=8960,
        layers=28,
        heads=12,
        kv_heads=2,
        vision_depth=32,
        vision_hidden=1280,
        vision_intermediate=3420,
        vision_heads=16,
        min_pixels=56 * 56,
        max_pixels=1280 * 28 * 28,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
}


def _mrope_section(arch: str, head_dim: int) -> list[int]:
    half = head_dim // 2
    if arch == "qwen3_vl":  # interleaved layout, [24, 20, 20] at head_dim 128
        hw = half * 20 // 64
        return [half - 2 * hw, hw, hw]
    t = half // 4  # Qwen2/2.5: [16, 24, 24] at head_dim 128
    return [t, (half - t) // 2, half - t - (half - t) // 2]


def patch_size(arch: str) -> int:
    return 16 if arch == "qwen3_vl" else 14


def config_dict(arch: str, size: Size, vocab_size: int, token_ids: dict[str, int]) -> dict:
    """The transformers config (as a dict) for ``arch`` at ``size``."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {ARCHS}")
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": _mrope_section(arch, size.head_dim)}
    if arch == "qwen3_vl":
        rope["mrope_interleaved"] = True
    text: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.max_position_embeddings,
        rope_parameters=rope,
        initializer_range=size.init_std,
        tie_word_embeddings=size.tie_word_embeddings,
        bos_token_id=token_ids["<|endoftext|>"],
        eos_token_id=token_ids["<|im_end|>"],
        pad_token_id=token_ids["<|endoftext|>"],
    )
    if arch == "qwen3_vl":
        text["head_dim"] = size.head_dim
    vision = _vision_config(arch, size)
    return dict(
        model_type=arch,
        text_config=text,
        vision_config=vision,
        image_token_id=token_ids["<|image_pad|>"],
        video_token_id=token_ids["<|video_pad|>"],
        vision_start_token_id=token_ids["<|vision_start|>"],
        vision_end_token_id=token_ids["<|vision_end|>"],
        tie_word_embeddings=size.tie_word_embeddings,
    )


def _vision_config(arch: str, size: Size) -> dict[str, Any]:
    """The vision tower's part of :func:`config_dict`: what the three architectures share, then each one's own."""
    vision: dict[str, Any] = dict(
        depth=size.vision_depth,
        num_heads=size.vision_heads,
        in_channels=3,
        patch_size=patch_size(arch),
        spatial_merge_size=2,
        temporal_patch_size=2,
        initializer_range=size.init_std,
    )
    if arch == "qwen2_vl":
        vision.update(
            embed_dim=size.vision_hidden,
            hidden_size=size.hidden,
            mlp_ratio=size.vision_intermediate // size.vision_hidden,
        )
    elif arch == "qwen2_5_vl":
        vision.update(
            hidden_size=size.vision_hidden,
            intermediate_size=size.vision_intermediate,
            out_hidden_size=size.hidden,
            window_size=112,
            fullatt_block_indexes=[i for i in range(size.vision_depth) if i % 8 == 7] or [size.vision_depth - 1],
        )
    else:
        vision.update(
            hidden_size=size.vision_hidden,
            intermediate_size=size.vision_intermediate,
            out_hidden_size=size.hidden,
            num_position_embeddings=2304 if size.vision_depth > 8 else 256,
            deepstack_visual_indexes=[size.vision_depth // 4, size.vision_depth // 2, 3 * size.vision_depth // 4]
            if size.vision_depth >= 8
            else [0],
        )
    return vision


def image_processor_kwargs(arch: str, size: Size) -> dict:
    """Settings of the (torchvision-backend) ``Qwen2VLImageProcessor`` for ``arch``."""
    qwen3 = arch == "qwen3_vl"
    return dict(
        size={"shortest_edge": size.min_pixels, "longest_edge": size.max_pixels},
        patch_size=patch_size(arch),
        temporal_patch_size=2,
        merge_size=2,
        image_mean=(0.5, 0.5, 0.5) if qwen3 else _CLIP_MEAN,
        image_std=(0.5, 0.5, 0.5) if qwen3 else _CLIP_STD,
    )
