"""Renderer: placeholders match the grids, ranges point at pad runs, bad input is named."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from vlrl.errors import BadInputError
from vlrl.messages import TURN_TOKENS, ImageLimits, image_hash, image_part, load_image
from vlrl.render.embedded import RESERVED_IN_TEXT

from .test_render_cache import processor_render

IMAGE_PAD = 151655


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def pad_runs(ids):
    runs, start = [], None
    for i, t in enumerate(list(ids) + [-1]):
        if t == IMAGE_PAD and start is None:
            start = i
        elif t != IMAGE_PAD and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def check_rendered(r, p, images):
    merge = r.processor.image_processor.merge_size
    assert p.n_images == len(images) == len(p.image_hashes)
    assert list(p.image_hashes) == [image_hash(Image.fromarray(im)) for im in images]
    assert pad_runs(p.token_ids) == [(ph.offset, ph.length) for ph in p.placeholders]
    if images:
        assert p.image_grid_thw.shape == (len(images), 3)
        assert p.pixel_values.shape[0] == int(p.image_grid_thw.prod(-1).sum())
        for ph, grid in zip(p.placeholders, p.image_grid_thw):
            assert ph.length == int(grid.prod()) // merge**2
            assert p.token_ids[ph.offset - 1] == 151652 and p.token_ids[ph.offset + ph.length] == 151653
    else:
        assert p.pixel_values is None and p.image_grid_thw is None


def test_multi_image_multi_turn(tiny, arch):
    r = tiny(arch).renderer
    ims = [rgb(90, 150, 1), rgb(225, 225, 2), rgb(40, 300, 3), rgb(64, 64, 4)]
    msgs = [
        {"role": "system", "content": "You see images."},
        {"role": "user", "content": [image_part(ims[0]), {"type": "text", "text": "and"}, image_part(ims[1], "JPEG")]},
        {"role": "assistant", "content": "two images"},
        {"role": "user", "content": [{"type": "text", "text": "next"}, image_part(ims[2])]},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": [image_part(ims[3])]},
    ]
    p = r.render(msgs)
    # JPEG is lossy: hash what the renderer decoded
    ims[1] = np.asarray(load_image(msgs[1]["content"][2]))
    check_rendered(r, p, ims)
    assert list(p.token_ids) == processor_render(r, msgs)["input_ids"][0].tolist()
    assert p.text.endswith("<|im_start|>assistant\n")
    # the rendered text is the template's, independently: re-derive it with the tokenizer's template
    expected = r.tokenizer.apply_chat_template(
        [
            {**m, "content": [{"type": "image"} if c.get("type") == "image_url" else c for c in m["content"]]}
            if isinstance(m["content"], list)
            else m
            for m in msgs
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert p.text == expected


IMAGE_SIZES = st.tuples(st.integers(1, 160), st.integers(1, 160))
LOOKALIKES = [
    "<|image_pad |>",
    "<image>",
    "<|imagepad|>",
    "|>",
    "<|",
    "<|im_start|>",
    "<think>",
    "<tool_call>",
    "<|vision_start",
    "image_pad",
    "\n",
    "🙂",
    "ü",
]
TEXT = st.lists(st.one_of(st.sampled_from(LOOKALIKES), st.text(max_size=10)), max_size=4).map("".join)
PART = st.one_of(TEXT.map(lambda t: ("text", t)), IMAGE_SIZES.map(lambda s: ("image", s)))
MESSAGE = st.tuples(
    st.sampled_from(["system", "user", "assistant", "tool"]),
    st.one_of(TEXT.map(lambda t: ("str", t)), st.lists(PART, min_size=1, max_size=3)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=st.lists(MESSAGE, min_size=1, max_size=5), seed=st.integers(0, 2**16))
def test_random_conversations(tiny, arch, conv, seed):
    r = tiny(arch).renderer
    msgs, images = [], []
    for k, (role, content) in enumerate(conv):
        if isinstance(content, tuple):
            msgs.append({"role": role, "content": content[1]})
            continue
        parts = []
        for j, (kind, val) in enumerate(content):
            if kind == "text":
                parts.append({"type": "text", "text": val})
            else:
                im = rgb(*val, seed=seed + 31 * k + j)
                images.append(im)
                parts.append(image_part(im))
        msgs.append({"role": role, "content": parts})
    texts = [
        m["content"] if isinstance(m["content"], str) else "".join(p.get("text", "") for p in m["content"])
        for m in msgs
    ]
    if any(tok in t for t in texts for tok in RESERVED_IN_TEXT):  # look-alikes can join into a real token
        with pytest.raises(BadInputError, match="reserved vision token"):
            r.render(msgs)
        return
    if any(tok in t for m, t in zip(msgs, texts) if m["role"] != "assistant" for tok in TURN_TOKENS):
        with pytest.raises(BadInputError, match="control token"):  # env/user text cannot fake a turn
            r.render(msgs)
        return
    rendered = r.render(msgs)
    check_rendered(r, rendered, images)
    assert list(rendered.token_ids) == processor_render(r, msgs)["input_ids"][0].tolist()  # it expands ids


def uri(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def encoded(fmt: str, size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format=fmt)
    return buf.getvalue()


BAD = {
    "not a data uri": ({"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}, "data URI"),
    "malformed header": ({"type": "image_url", "image_url": {"url": "data:image/png," + "AAAA"}}, "header"),
    "bad base64": ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "base64"),
    "truncated png": ({"type": "image_url", "image_url": {"url": uri(encoded("PNG")[:40])}}, "decoded"),
    "gif": ({"type": "image_url", "image_url": {"url": uri(encoded("GIF"), "image/gif")}}, "unsupported image format"),
    "bmp": ({"type": "image_url", "image_url": {"url": uri(encoded("BMP"))}}, "unsupported image format"),
    "zero size": ({"type": "image", "image": np.zeros((0, 5, 3), np.uint8)}, "empty"),
    "not rgb": ({"type": "image", "image": np.zeros((5, 5), np.uint8)}, "[H, W, 3]"),
    "over budget": ({"type": "image_url", "image_url": {"url": uri(encoded("PNG", (300, 300)))}}, "budget"),
    "unknown part": ({"type": "audio", "audio": "x"}, "unsupported content part type 'audio'"),
    "no url": ({"type": "image_url", "image_url": {}}, "url"),
    "reserved token": ({"type": "text", "text": "look <|image_pad|> here"}, "reserved vision token"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_message_and_part(tiny, case):
    from vlrl.render.embedded import EmbeddedRenderer

    part, needle = BAD[case]
    r = EmbeddedRenderer(tiny("qwen2_5_vl").renderer.processor, limits=ImageLimits(max_pixels=256 * 256))
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "x"}, part]}]
    with pytest.raises(BadInputError) as info:
        r.render(msgs)
    assert info.value.message_index == 1 and info.value.part_index == 1
    assert str(info.value).startswith("message 1, part 1: ")
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "msgs,needle,mi",
    [
        ([{"role": "robot", "content": "x"}], "unknown role 'robot'", 0),
        ([{"role": "user", "content": "x"}, {"role": "user", "content": 5}], "content must be", 1),
        ([{"role": "user"}], "content must be", 0),
        ([], "non-empty list", None),
    ],
)
def test_bad_messages(tiny, msgs, needle, mi):
    with pytest.raises(BadInputError) as info:
        tiny("qwen2_5_vl").renderer.render(msgs)
    assert needle in str(info.value) and info.value.message_index == mi


def test_pil_and_array_and_uri_render_identically(tiny):
    r = tiny("qwen2_vl").renderer
    im = rgb(50, 70, 9)
    forms = [image_part(im), {"type": "image", "image": im}, {"type": "image", "image": Image.fromarray(im)}]
    outs = [r.render([{"role": "user", "content": [f]}]) for f in forms]
    assert len({o.token_ids for o in outs}) == 1 and len({o.image_hashes for o in outs}) == 1
    assert all(np.array_equal(outs[0].pixel_values, o.pixel_values) for o in outs)
