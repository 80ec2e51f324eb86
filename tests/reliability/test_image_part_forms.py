"""Image-part forms: every accepted form becomes the one canonical part, and renders identically.

``normalize_messages`` is what both renderers go through (the vLLM renderer sends its result to the
server), so a form is accepted by one renderer exactly when it is accepted by the other.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from reliability_helpers import jpeg_bytes, rgb, transparent_images, url_part

from vlrl.errors import BadInputError
from vlrl.messages import encode_image, load_image, normalize_messages, prepare_messages

PIXELS = rgb(30, 44, 3)


def forms() -> dict[str, dict]:
    data_uri = encode_image(PIXELS)
    return {
        "image_url dict": {"type": "image_url", "image_url": {"url": data_uri}},
        "image_url dict with detail": {"type": "image_url", "image_url": {"url": data_uri, "detail": "high"}},
        "image_url bare string": {"type": "image_url", "image_url": data_uri},
        "image with data URI": {"type": "image", "image": data_uri},
        "image with PIL image": {"type": "image", "image": Image.fromarray(PIXELS)},
        "image with PIL image (lazy, from a file)": {
            "type": "image",
            "image": Image.open(io.BytesIO(url_part_bytes(data_uri))),
        },
        "image with array": {"type": "image", "image": PIXELS},
        "image with url": {"type": "image", "url": data_uri},
        "image with image_url": {"type": "image", "image_url": {"url": data_uri}},
    }


def url_part_bytes(data_uri: str) -> bytes:
    import base64

    return base64.b64decode(data_uri.partition(",")[2])


def conversation(part: dict) -> list[dict]:
    return [{"role": "system", "content": "s"}, {"role": "user", "content": [part, {"type": "text", "text": "what?"}]}]


@pytest.mark.parametrize("form", sorted(forms()))
def test_every_form_normalises_to_the_canonical_part(form):
    messages = conversation(forms()[form])
    before = repr(messages)
    out = normalize_messages(messages)
    part = out[1]["content"][0]
    assert set(part) == {"type", "image_url"} and part["type"] == "image_url" and set(part["image_url"]) == {"url"}
    assert part["image_url"]["url"].startswith("data:image/")
    assert np.array_equal(np.asarray(load_image(part)), PIXELS)
    assert out[1]["content"][1] == {"type": "text", "text": "what?"} and out[0] == messages[0]
    assert normalize_messages(out) == out  # idempotent
    assert repr(messages) == before  # the input is left alone


def test_every_form_renders_identically(tiny):
    renderer = tiny("qwen2_5_vl").renderer
    renders = {form: renderer.render(conversation(part)) for form, part in forms().items()}
    first = next(iter(renders.values()))
    for form, r in renders.items():
        assert r.token_ids == first.token_ids and r.image_hashes == first.image_hashes, form
        assert np.array_equal(r.pixel_values, first.pixel_values), form


@pytest.mark.parametrize(
    "raw, mime",
    [
        (transparent_images()["RGBA"], "image/png"),
        (transparent_images()["P_tRNS"], "image/png"),
        (jpeg_bytes(Image.fromarray(rgb(20, 36)), 6), "image/jpeg"),
    ],
)
def test_canonical_part_decodes_plainly_to_the_model_pixels(raw, mime):
    """Images a plain decoder would read differently (alpha, palette transparency, EXIF rotation) travel
    as a PNG of the decoded pixels: whatever decodes them next sees exactly what the model receives."""
    prepared = prepare_messages([{"role": "user", "content": [url_part(raw, mime)]}])
    canonical = prepared.messages[0]["content"][0]["image_url"]["url"]
    plain = Image.open(io.BytesIO(url_part_bytes(canonical)))
    assert plain.mode == "RGB" and "transparency" not in plain.info and not plain.getexif()
    assert np.array_equal(np.asarray(plain), np.asarray(prepared.images[0]))


@pytest.mark.parametrize(
    "part, needle",
    [
        ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "data URI"),
        ({"type": "image"}, "no 'image' value"),
        ({"type": "image", "image": 3}, "must be a PIL image"),
        ({"type": "image_url", "image_url": {"href": "x"}}, "no 'url' string"),
    ],
)
def test_unaccepted_forms_are_refused_naming_message_and_part(part, needle):
    with pytest.raises(BadInputError, match=needle) as err:
        normalize_messages(conversation(part))
    assert (err.value.message_index, err.value.part_index) == (1, 0)
