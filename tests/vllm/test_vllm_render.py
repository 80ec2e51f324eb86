"""vLLM's render == the embedded renderer's, and bad input is refused with its location."""

from __future__ import annotations

import pytest
import torch

from vllm_cases import conversations
from vlrl.errors import BadInputError
from vlrl.messages import image_part, text_part

pytestmark = pytest.mark.vllm
CASES = conversations()


# qwen2_vl shares Qwen2.5-VL's processor and template; its server is exercised in test_vllm_failures.
@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_embedded(vllm_stack, tiny, arch, case):
    messages, tools = CASES[case]
    got = vllm_stack(arch).renderer.render(messages, tools=tools)
    want = tiny(arch).renderer.render(messages, tools=tools)
    assert got.token_ids == want.token_ids
    assert got.placeholders == want.placeholders
    assert got.image_hashes == want.image_hashes
    assert got.text == want.text
    assert len(got.engine_features) == got.n_images
    if want.pixel_values is None:
        assert got.pixel_values is None and got.image_grid_thw is None
    else:
        assert torch.equal(got.image_grid_thw, want.image_grid_thw)
        assert got.pixel_values.dtype == torch.float32
        assert (got.pixel_values - want.pixel_values).abs().max().item() <= 1e-6


def test_bad_input_names_message_and_part(vllm_stack):
    renderer = vllm_stack("qwen2_5_vl").renderer
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(BadInputError) as err:
        renderer.render([{"role": "user", "content": "hi"}, {"role": "user", "content": [text_part("x"), broken]}])
    assert (err.value.message_index, err.value.part_index) == (1, 1)
    with pytest.raises(BadInputError, match="reserved vision token"):
        renderer.render([{"role": "user", "content": "look <|image_pad|>"}])
    with pytest.raises(BadInputError, match="unknown role"):
        renderer.render([{"role": "robot", "content": "hi"}])


def test_server_refusal_becomes_bad_input(vllm_stack):
    """More images than the server's --limit-mm-per-prompt: the server's 400 names the limit."""
    from vllm_cases import image

    stack = vllm_stack("qwen2_5_vl")
    limit = stack.servers[0].config.max_images_per_prompt
    parts = [image_part(image(28, 28, i)) for i in range(limit + 1)]
    with pytest.raises(BadInputError, match="refused the request"):
        stack.renderer.render([{"role": "user", "content": parts}])
