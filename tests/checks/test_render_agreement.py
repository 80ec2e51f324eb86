"""``check_render_agreement``: two renderers that differ in ids, grids or pixels are stopped, naming what differs;
pixels are held to one unit in the last place of the dtype the engine sees."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vlrl.checks.render_agreement import RenderDisagreementError, check_render_agreement
from vlrl.vllm.items import codec_probe


class Altered:
    """A renderer whose answers ``change`` alters (a fault a real server's processor would make on its own)."""

    def __init__(self, inner, change):
        self.inner, self.change, self.tokenizer = inner, change, inner.tokenizer

    def render(self, messages, **kw):
        return self.change(self.inner.render(messages, **kw))


def _scaled(p, by: float):
    return dataclasses.replace(p, pixel_values=p.pixel_values * (1 + by))


def test_equal_renderers_agree_exactly(tiny, arch):
    r = tiny(arch).renderer
    got = check_render_agreement(r, Altered(r, lambda p: p), codec_probe())
    assert got.images == 1 and got.pixel_max_abs == 0.0 and got.tokens > got.images


def test_ids_grids_and_pixels_that_differ_are_named(tiny):
    r = tiny("qwen2_5_vl").renderer
    extra = Altered(r, lambda p: dataclasses.replace(p, token_ids=p.token_ids[:-1] + (p.token_ids[-1] + 1,)))
    with pytest.raises(RenderDisagreementError, match="token ids"):
        check_render_agreement(r, extra, codec_probe())
    flipped = Altered(r, lambda p: dataclasses.replace(p, image_grid_thw=p.image_grid_thw.flip(-1)))
    with pytest.raises(RenderDisagreementError, match="image grids"):
        check_render_agreement(r, flipped, codec_probe())
    with pytest.raises(RenderDisagreementError, match="pixels in torch.float32"):
        check_render_agreement(r, Altered(r, lambda p: _scaled(p, 1e-3)), codec_probe())


def test_pixels_are_compared_in_the_engines_dtype(tiny):
    """A 1e-3 relative change is below one bf16 ulp (2^-7): a bf16 engine sees at most a one-ulp rounding
    difference, which is allowed there and not in float32; 5 % is beyond it in any dtype."""
    r = tiny("qwen2_5_vl").renderer
    small = Altered(r, lambda p: _scaled(p, 1e-3))
    got = check_render_agreement(r, small, codec_probe(), pixel_dtype=torch.bfloat16)
    assert 0 <= got.pixel_max_abs <= got.pixel_bound
    with pytest.raises(RenderDisagreementError, match="pixels in torch.bfloat16"):
        check_render_agreement(r, Altered(r, lambda p: _scaled(p, 5e-2)), codec_probe(), pixel_dtype=torch.bfloat16)
