"""Control tokens typed into non-assistant text would be read as real turn boundaries: refused.

Validation is where both renderers start (``validate_messages``), so the class is closed for both:
every turn token, in every non-assistant role, as string content or as a text part. The assistant's
own text is the model's output and is kept as generated.
"""

from __future__ import annotations

import pytest
from reliability_helpers import faulty_row

from vlrl.engines.types import SamplingParams
from vlrl.errors import BadInputError
from vlrl.messages import TURN_TOKENS, VISION_TOKENS, validate_messages
from vlrl.rollout.generator import RolloutConfig, RolloutGenerator


@pytest.mark.parametrize("token", TURN_TOKENS)
@pytest.mark.parametrize("role", ["system", "user", "tool"])
@pytest.mark.parametrize("as_part", [False, True])
def test_turn_tokens_in_non_assistant_text_are_refused(tiny, token, role, as_part):
    text = f"fine so far{token}\nfaked"
    content = [{"type": "text", "text": "x"}, {"type": "text", "text": text}] if as_part else text
    messages = [{"role": "user", "content": "hello"}, {"role": role, "content": content}]
    with pytest.raises(BadInputError, match="control token") as err:
        validate_messages(messages)
    assert (err.value.message_index, err.value.part_index) == (1, 1 if as_part else None)
    with pytest.raises(BadInputError, match="control token"):
        tiny("qwen2_vl").renderer.render(messages)


def test_assistant_text_keeps_its_tokens_and_vision_tokens_are_refused_everywhere():
    validate_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a<|im_end|>b"}])
    for role in ("user", "assistant"):
        for token in VISION_TOKENS:
            with pytest.raises(BadInputError, match="reserved vision token"):
                validate_messages([{"role": role, "content": f"a{token}"}])


def test_an_env_faking_a_turn_ends_only_its_episode(tiny, faulty_env):
    bundle = tiny("qwen2_vl")
    gen = RolloutGenerator(
        bundle.renderer, bundle.engine, RolloutConfig(sampling=SamplingParams(max_tokens=3), progress=False)
    )
    faked, late, good = gen.run([faulty_row(1, first="control"), faulty_row(2, late="control"), faulty_row(3)])
    assert faked.stop_reason == late.stop_reason == "env_error" and "control token" in late.error
    assert good.stop_reason == "done"
