"""Images: one decoder, the inference stack's, with every refusal a BadInputError naming message and part.

Classes: decompression bombs (under PIL's own bomb limit and over it), aspect ratios over the
processor's limit, 16-bit images (scaled, never clipped), transparency in every PNG form (onto
white, as vLLM), EXIF orientation (all eight tags, as vLLM), and the image hash taken from the
pixels the model receives. Each is checked where images enter: the decoder, the renderer,
``check_env`` and a rollout.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps
from reliability_helpers import (
    bomb_png,
    faulty_row,
    jpeg_bytes,
    png_bytes,
    rgb,
    sixteen_bit_png,
    transparent_images,
    url_part,
)

from vlrl.checks.envs import check_env
from vlrl.engines.types import SamplingParams
from vlrl.errors import BadInputError
from vlrl.messages import image_hash, image_part, load_image, normalize_messages, text_part
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator

HOSTILE = {
    "bomb over vlrl's budget": url_part(bomb_png(5000, 5000)),
    "bomb over PIL's own limit": url_part(bomb_png(20_000, 20_000)),
    "aspect ratio 300": image_part(rgb(1, 300)),
    "aspect ratio 250 (array)": {"type": "image", "image": rgb(250, 1)},
}
RENDER_CFG = RolloutConfig(sampling=SamplingParams(max_tokens=3), progress=False)


def conversation(part: dict) -> list[dict]:
    return [{"role": "system", "content": "s"}, {"role": "user", "content": [text_part("look"), part]}]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_images_are_bad_input_naming_message_and_part(tiny, case):
    for refuse in (
        lambda m: normalize_messages(m),
        lambda m: tiny("qwen2_vl").renderer.render(m),
        lambda m: load_image(m[1]["content"][1], message_index=1, part_index=1),
    ):
        with pytest.raises(BadInputError) as err:
            refuse(conversation(HOSTILE[case]))
        assert (err.value.message_index, err.value.part_index) == (1, 1), case
        assert "budget" in str(err.value) or "bomb" in str(err.value) or "aspect ratio" in str(err.value)


def test_aspect_ratio_at_the_limit_renders():
    assert load_image(image_part(rgb(1, 200))).size == (200, 1)


@pytest.mark.parametrize("kind", ["bomb", "aspect", "broken"])
def test_check_env_reports_hostile_images_instead_of_crashing(faulty_env, kind):
    from vlrl.envs import env_factory

    report = check_env(
        env_factory(faulty_env, {"first": kind}), name=kind, n_episodes=1, n_hostile=0, raise_on_failure=False
    )
    assert not report.ok and {f.check for f in report.failures} == {"images"}, report.summary()


@pytest.mark.parametrize("kind", ["bomb", "aspect", "broken"])
def test_rollout_ends_only_the_episode_with_the_hostile_image(tiny, faulty_env, kind):
    bundle = tiny("qwen2_vl")
    gen = RolloutGenerator(bundle.renderer, bundle.engine, RENDER_CFG)
    first, late, good = gen.run([faulty_row(1, first=kind), faulty_row(2, late=kind), faulty_row(3)])
    assert first.stop_reason == late.stop_reason == "env_error"
    assert "first observation cannot be rendered" in first.error and "turn 0" in late.error
    assert len(late.turns) == 1 and good.stop_reason == "done" and len(good.turns) == 2


def test_sixteen_bit_images_are_scaled_not_clipped():
    raw, want = sixteen_bit_png()
    got = np.asarray(load_image(url_part(raw)))
    assert (got == want[..., None]).all()  # the gradient survives; clipping made it white above 255
    assert len(np.unique(got)) > 200
    canonical = normalize_messages([{"role": "user", "content": [url_part(raw)]}])[0]["content"][0]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(_bytes(canonical)))), got)  # what a server decodes


# ------------------------------------------------------------------ decoding as vLLM does


def vllm_decode(raw: bytes) -> Image.Image:
    """vLLM's ``ImageMediaIO.load_bytes`` (vllm 0.32, image_mode RGB), from vLLM's own
    ``vllm/multimodal/image.py`` loaded standalone (importing the vllm package takes ~10 s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    path = Path(spec.origin).parent / "multimodal" / "image.py"
    module_spec = importlib.util.spec_from_file_location("vllm_multimodal_image_standalone", path)
    vimg = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(vimg)
    image = vimg.normalize_image(vimg.open_image(io.BytesIO(raw)))
    image.load()
    if image.mode == "RGB":
        return image
    if image.mode == "RGBA":
        return vimg.rgba_to_rgb(image)
    return vimg.convert_image_mode(image, "RGB")


@pytest.mark.parametrize("mode", sorted(transparent_images()))
def test_transparency_is_composited_onto_white_as_vllm_does(mode):
    raw = transparent_images()[mode]
    got = load_image(url_part(raw))
    assert np.array_equal(np.asarray(got), np.asarray(vllm_decode(raw)))
    pixels = np.asarray(got)
    transparent = pixels[0, :1] if mode.endswith("tRNS") else pixels[:, 0]  # the key colour / the alpha-0 column
    assert (transparent == 255).all() and (pixels != 255).any()  # white where transparent, not its colour


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_vllm_does(orientation):
    base = Image.fromarray(rgb(20, 36, orientation))
    raw = jpeg_bytes(base, orientation)
    got = load_image(url_part(raw, "image/jpeg"))
    assert np.array_equal(np.asarray(got), np.asarray(vllm_decode(raw)))
    assert got.size == ImageOps.exif_transpose(Image.open(io.BytesIO(raw))).size
    assert got.size == ((20, 36) if orientation >= 5 else (36, 20))


def test_the_hash_is_of_the_pixels_the_model_receives(tiny):
    """An RGBA PNG and the RGB PNG of its composite are the same model input: same hash, same tensors."""
    rgba_raw = transparent_images()["RGBA"]
    flattened = png_bytes(load_image(url_part(rgba_raw)))
    renders = [
        tiny("qwen2_5_vl").renderer.render([{"role": "user", "content": [url_part(raw)]}])
        for raw in (rgba_raw, flattened)
    ]
    assert renders[0].image_hashes == renders[1].image_hashes
    assert np.array_equal(renders[0].pixel_values, renders[1].pixel_values)
    rotated = jpeg_bytes(Image.fromarray(rgb(20, 36)), 6)
    assert image_hash(load_image(url_part(rotated, "image/jpeg"))) != image_hash(Image.open(io.BytesIO(rotated)))


def _bytes(part: dict) -> bytes:
    import base64

    return base64.b64decode(part["image_url"]["url"].partition(",")[2])
