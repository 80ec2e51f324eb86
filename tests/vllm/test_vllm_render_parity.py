"""Render parity on the image classes the goldens do not cover: transparency (every alpha-carrying PNG
form, palette transparency included), EXIF-rotated JPEGs (a 90° tag swaps the grid) and 16-bit PNGs.

Two layers: vLLM's own decoder (``ImageMediaIO.load_bytes``, in process) gives exactly the pixels of
vlrl's decoder for the raw bytes (16-bit excepted: vLLM clips, vlrl scales — which is why such images
reach the server re-encoded); and the vLLM renderer gives the embedded renderer's ids, placeholders,
grids, hashes and pixels for each of them.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from vlrl.messages import load_image, text_part

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"
N_SERVERS = {"qwen2_vl": 2}  # as the other render tests, so the running stacks are reused


def _png(image: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **save)
    return buf.getvalue()


def _jpeg(image: Image.Image, orientation: int) -> bytes:
    buf, exif = io.BytesIO(), Image.Exif()
    exif[0x0112] = orientation
    image.save(buf, format="JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def images() -> dict[str, tuple[bytes, str]]:
    """name -> (raw bytes, mime): each with opaque, half and fully transparent pixels where it has alpha."""
    rng = np.random.default_rng(5)
    colour = rng.integers(0, 256, (40, 72, 3), dtype=np.uint8)
    alpha = np.tile(np.array([0, 128, 255], dtype=np.uint8), (40, 24))
    rgba = Image.fromarray(np.dstack([colour, alpha]), "RGBA")
    palette = rgba.convert("RGB").quantize(16)
    grey = Image.fromarray(colour[..., 0], "L")
    sixteen = Image.fromarray(np.linspace(0, 65535, 40 * 72).astype(np.uint16).reshape(40, 72))
    out = {
        "RGBA": (_png(rgba), "image/png"),
        "LA": (_png(Image.fromarray(np.dstack([colour[..., 0], alpha]), "LA")), "image/png"),
        "palette tRNS": (_png(palette, transparency=int(np.asarray(palette)[0, 0])), "image/png"),
        "palette alpha table": (_png(rgba.quantize(16)), "image/png"),
        "grey tRNS": (_png(grey, transparency=int(colour[0, 0, 0])), "image/png"),
        "16-bit grey": (_png(sixteen), "image/png"),
    }
    for orientation in range(1, 9):
        out[f"JPEG EXIF {orientation}"] = (_jpeg(Image.fromarray(colour), orientation), "image/jpeg")
    return out


IMAGES = images()


def part(name: str) -> dict:
    raw, mime = IMAGES[name]
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(raw).decode()}"}}


@pytest.mark.parametrize("name", sorted(n for n in IMAGES if n != "16-bit grey"))
def test_vllm_decoder_gives_vlrl_pixels(name):
    pytest.importorskip("vllm")
    from vllm.multimodal.media.image import ImageMediaIO

    raw, _ = IMAGES[name]
    theirs = ImageMediaIO(image_mode="RGB").load_bytes(raw).media
    ours = load_image(part(name))
    assert theirs.mode == ours.mode == "RGB" and theirs.size == ours.size
    assert np.array_equal(np.asarray(theirs), np.asarray(ours))


def test_vllm_render_matches_embedded_on_alpha_palette_exif_and_16_bit(vllm_stack, tiny, arch):
    renderer = vllm_stack(arch, N_SERVERS.get(arch, 1)).server_renderer
    for name in sorted(IMAGES):
        messages = [{"role": "user", "content": [part(name), text_part(f"What is in {name}?")]}]
        got, want = renderer.render(messages), tiny(arch).renderer.render(messages)
        assert got.token_ids == want.token_ids and got.placeholders == want.placeholders, name
        assert got.image_hashes == want.image_hashes, name
        assert torch.equal(got.image_grid_thw, want.image_grid_thw), name
        assert (got.pixel_values - want.pixel_values).abs().max().item() <= 1e-6, name
    turned = tiny(arch).renderer.render([{"role": "user", "content": [part("JPEG EXIF 6")]}])
    upright = tiny(arch).renderer.render([{"role": "user", "content": [part("JPEG EXIF 1")]}])
    assert turned.image_grid_thw[0, 1:].tolist() == upright.image_grid_thw[0, 1:].flip(0).tolist()
