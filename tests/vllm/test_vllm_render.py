"""vLLM's render == the embedded renderer's, and bad input is refused with its location."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm_cases import conversations, image

from vlrl.errors import BadInputError
from vlrl.messages import encode_image, text_part

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"  # for the tests here that take no arch parameter
CASES = conversations()
ARCHS = ("qwen2_5_vl", "qwen3_vl", "qwen2_vl")  # server order: qwen2_vl last (test_vllm_failures kills its servers)
N_SERVERS = {"qwen2_vl": 2}  # qwen2_vl's stack has two servers (test_vllm_failures kills them at the end)


def golden_conversations(tiny, arch):
    """Every conversation of every golden scenario: each turn's prompt (the messages before each
    assistant reply, with the generation prompt) and the final conversation (without it)."""
    from vlrl.golden.files import play
    from vlrl.golden.scenarios import SCENARIOS

    bundle = tiny(arch)
    for name, sc in sorted(SCENARIOS.items()):
        msgs = list(play(sc, bundle.renderer, bundle.engine.max_context).messages)
        cuts = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        for k, i in enumerate(cuts):
            yield f"{name}/turn{k}", msgs[:i], True
        if msgs[-1]["role"] != "assistant":
            yield f"{name}/last", msgs, True
        yield f"{name}/final", msgs, False


def assert_same_render(got, want, what=""):
    assert got.token_ids == want.token_ids, what
    assert got.placeholders == want.placeholders, what
    assert got.image_hashes == want.image_hashes, what
    assert got.text == want.text, what
    assert len(got.engine_features) == got.n_images, what
    if want.pixel_values is None:
        assert got.pixel_values is None and got.image_grid_thw is None, what
    else:
        assert torch.equal(got.image_grid_thw, want.image_grid_thw), what
        assert got.pixel_values.dtype == torch.float32 and got.pixel_values.shape == want.pixel_values.shape, what
        assert (got.pixel_values - want.pixel_values).abs().max().item() <= 1e-6, what


@pytest.mark.parametrize("arch", ARCHS)
def test_every_golden_conversation_renders_identically(vllm_stack, tiny, arch):
    renderer, n = vllm_stack(arch, N_SERVERS.get(arch, 1)).server_renderer, 0
    for what, messages, gen_prompt in golden_conversations(tiny, arch):
        got = renderer.render(messages, add_generation_prompt=gen_prompt)
        want = tiny(arch).renderer.render(messages, add_generation_prompt=gen_prompt)
        assert_same_render(got, want, f"{arch} {what}")
        n += 1
    assert n == 18  # 6 scenarios: every turn prompt and the final conversation


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_embedded(vllm_stack, tiny, arch, case):
    messages, tools = CASES[case]
    got = vllm_stack(arch, N_SERVERS.get(arch, 1)).server_renderer.render(messages, tools=tools)
    want = tiny(arch).renderer.render(messages, tools=tools)
    assert_same_render(got, want, case)


def test_bad_input_names_message_and_part(vllm_stack):
    renderer = vllm_stack("qwen2_5_vl").server_renderer
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(BadInputError) as err:
        renderer.render([{"role": "user", "content": "hi"}, {"role": "user", "content": [text_part("x"), broken]}])
    assert (err.value.message_index, err.value.part_index) == (1, 1)
    with pytest.raises(BadInputError, match="reserved vision token"):
        renderer.render([{"role": "user", "content": "look <|image_pad|>"}])
    with pytest.raises(BadInputError, match="unknown role"):
        renderer.render([{"role": "robot", "content": "hi"}])


def _image_forms():
    """Every image-part form the embedded renderer accepts (``vlrl.messages``), for one image."""
    img = image(60, 90, 7)
    uri = encode_image(img)
    return {
        "image_url": {"type": "image_url", "image_url": {"url": uri}},
        "image_url_bare_string": {"type": "image_url", "image_url": uri},
        "image_pil": {"type": "image", "image": img},
        "image_array": {"type": "image", "image": np.asarray(img)},
        "image_data_uri": {"type": "image", "image": uri},
        "image_url_key": {"type": "image", "url": uri},
    }


@pytest.mark.parametrize("form", sorted(_image_forms()))
def test_every_image_part_form_the_embedded_renderer_accepts(vllm_stack, tiny, form):
    """Normalised before anything reaches the server: the same render as the embedded renderer's, and as the
    canonical ``image_url`` data-URI part's."""
    stack, bundle = vllm_stack(ARCH), tiny(ARCH)

    def conversation(part):
        return [{"role": "user", "content": [text_part("Look:"), part, text_part("What is it?")]}]

    messages = conversation(_image_forms()[form])
    want = bundle.renderer.render(messages)
    got = stack.server_renderer.render(messages)
    assert_same_render(got, want, form)
    assert got.token_ids == stack.server_renderer.render(conversation(_image_forms()["image_url"])).token_ids
    assert form == "image_array" or messages[0]["content"][1] == _image_forms()[form]  # the caller's parts untouched


def test_server_refusal_becomes_bad_input(vllm_stack):
    """A prompt longer than the server's --max-model-len: the server's 400 becomes a BadInputError."""
    stack = vllm_stack("qwen2_5_vl")
    text = "hello " * (stack.config.max_model_len + 10)
    with pytest.raises(BadInputError, match="refused the request"):
        stack.server_renderer.render([{"role": "user", "content": text}])
