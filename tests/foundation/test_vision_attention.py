"""The vision towers' attention in one call per block (vlrl.models.attention.VISION) is the per-image loop's
attention: same features, far fewer SDPA calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vlrl.models.attention import ATTENTION, VISION
from vlrl.models.load import load_model, load_processor


def _features(model, inputs) -> torch.Tensor:
    out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    feats = getattr(out, "pooler_output", out)  # a ModelOutput in newer transformers, a tuple in older
    return torch.cat([f.reshape(-1, f.shape[-1]) for f in feats])


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_one_call_per_block_gives_the_loops_features(arch, vlrl_model_dir, monkeypatch):
    model_dir = vlrl_model_dir(arch)
    model = load_model(model_dir)
    vision = model.config.vision_config
    assert vision._attn_implementation == VISION
    # two sizes, the first and last alike: three runs of equal-length segments per full-attention block
    sizes = [(112, 112), (112, 112), (224, 168), (112, 112)]
    rng = np.random.default_rng(0)  # noise: every patch different, so a token attending to the wrong ones shows
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    text = "".join("<|vision_start|><|image_pad|><|vision_end|>" for _ in images)
    inputs = load_processor(model_dir)(text=[text], images=images, return_tensors="pt")

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    with torch.no_grad():
        batched = _features(model, inputs)
        n_batched = len(calls)
        vision._attn_implementation = ATTENTION  # transformers' loop, one call per image (or window)
        looped = _features(model, inputs)
        n_looped = len(calls) - n_batched
    assert batched.shape == looped.shape
    assert torch.allclose(batched, looped, atol=1e-5, rtol=0), float((batched - looped).abs().max())
    blocks = len(model.model.visual.blocks)
    assert n_looped >= blocks * len(images)  # at least one call per image per block
    assert n_batched <= blocks * 3, (n_batched, n_looped)
    print(arch, n_batched, n_looped)  # one per run of equal lengths


def test_packed_images_under_unknown_boundary_names_are_refused():
    """Attending over all images at once without their boundaries would mix images silently."""
    from vlrl.models.attention import vision_varlen_forward

    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        vision_varlen_forward(torch.nn.Identity(), q, q, q, cu_seqlens_q=torch.tensor([0, 4, 8]), max_length_q=4)
    out, _ = vision_varlen_forward(torch.nn.Identity(), q, q, q)  # one image: transformers' loop
    assert out.shape == (1, 8, 2, 4)


def test_segment_lengths_are_read_once_per_boundaries_tensor():
    """Every block of a tower gets the same boundaries tensor: its lengths are read to the host once (on CUDA each
    read is a sync), kept on the tensor, and read again after an in-place change."""
    from vlrl.models.attention import LENGTHS_ATTR, segment_lengths

    cu = torch.tensor([0, 16, 16 + 64, 16 + 64 + 16], dtype=torch.int32)
    assert segment_lengths(cu) == [16, 64, 16]
    assert getattr(cu, LENGTHS_ATTR) == (cu._version, (16, 64, 16))
    setattr(cu, LENGTHS_ATTR, (cu._version, (1, 2, 3)))  # what a second block reads: the kept lengths, not the tensor
    assert segment_lengths(cu) == [1, 2, 3]
    cu[3] = 100
    assert segment_lengths(cu) == [16, 64, 20]
