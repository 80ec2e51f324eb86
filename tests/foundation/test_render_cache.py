"""The embedded renderer's image cache: what it renders equals the processor's own call (ids, grids, pixels,
bit for bit) on first render and from the cache, for every architecture; a turn processes only its new image."""

from __future__ import annotations

import numpy as np
import torch

from vlrl.messages import image_part, prepare_messages
from vlrl.render.embedded import _template_messages


def rgb(h, w, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def conversations():
    same = image_part(rgb(64, 64, 1))
    return [
        [{"role": "user", "content": "text only"}],
        [{"role": "user", "content": [image_part(rgb(90, 150, 2)), {"type": "text", "text": "one"}]}],
        [
            {"role": "system", "content": [image_part(rgb(28, 300, 3)), {"type": "text", "text": "sys"}]},
            {"role": "user", "content": [same, {"type": "text", "text": "a"}, image_part(rgb(112, 80, 4)), same]},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": [image_part(rgb(40, 120, 5)), {"type": "text", "text": "c"}]},
        ],
    ]


def processor_render(renderer, messages):
    """What the renderer did before the cache: the whole processor call on the template text and all images."""
    prepared = prepare_messages(messages, limits=renderer.limits)
    text = renderer.processor.apply_chat_template(
        _template_messages(prepared.messages), tokenize=False, add_generation_prompt=True
    )
    return renderer.processor(text=[text], images=list(prepared.images) or None, return_tensors="pt")


def test_cached_render_equals_the_processor_call(tiny, arch):
    renderer = tiny(arch).renderer
    for messages in conversations():
        want = processor_render(renderer, messages)
        for _ in range(2):  # the second render is served from the cache
            got = renderer.render(messages)
            assert list(got.token_ids) == want["input_ids"][0].tolist()
            if got.n_images:
                assert torch.equal(got.image_grid_thw, want["image_grid_thw"])
                assert torch.equal(got.pixel_values, want["pixel_values"])
            else:
                assert got.pixel_values is None and "pixel_values" not in want


def test_a_turn_processes_only_its_new_image_and_the_cache_is_bounded(tiny, monkeypatch):
    from vlrl.render.embedded import EmbeddedRenderer

    base = tiny("qwen2_5_vl").renderer
    calls = []
    cls = type(base.processor.image_processor)
    process = cls.__call__
    monkeypatch.setattr(cls, "__call__", lambda self, *a, **k: (calls.append(1), process(self, *a, **k))[1])
    for size in (10, 3):
        renderer, messages = EmbeddedRenderer(base.processor, cache_images=size), []
        calls.clear()
        for turn in range(5):
            messages += [
                {"role": "user", "content": [image_part(rgb(56, 56, 10 + turn)), {"type": "text", "text": "go"}]}
            ]
            renderer.render(messages)
            messages += [{"role": "assistant", "content": "ok"}]
            if size == 10:
                assert len(calls) == turn + 1  # one new image a turn, the earlier ones from the cache
        assert len(renderer._cache) == min(size, 5)


def test_forget_drops_the_cached_images_and_rows_and_renders_the_same_after(tiny):
    from vlrl.render.embedded import EmbeddedRenderer

    base = tiny("qwen2_5_vl").renderer
    renderer = EmbeddedRenderer(base.processor)
    messages = conversations()[2]
    before = renderer.render(messages)
    assert len(renderer._cache) and len(renderer._runs._runs)
    renderer.forget()  # the SFT farm's workers call it after each batch (vlrl.envs.maze_sft_farm)
    assert not len(renderer._cache) and not len(renderer._runs._runs)
    after = renderer.render(messages)
    assert list(after.token_ids) == list(before.token_ids) and torch.equal(after.pixel_values, before.pixel_values)
