"""The real Qwen vocabulary: known ids, special tokens at their real ids, lossless round trips."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlrl.models.tokenizer import build_tokenizer, special_tokens


@functools.cache
def tok(arch: str = "qwen2_5_vl"):
    return build_tokenizer(arch, chat_template="")


# Expected ids, and where each comes from:
# - "Hello world" -> [9707, 1879] and "你好" -> [108386]: the Qwen2 tokenizer's own test
#   (transformers tests/models/qwen2/test_tokenization_qwen2.py, and Qwen's README examples).
# - "user" 872, "assistant" 77091, "system" 8948, "\n" 198: the ids in every published Qwen2/2.5-VL
#   chat-template rendering ("<|im_start|>user\n" = 151644, 872, 198).
# - " " 220 and single digits "0".."9" = 15..24: byte-level ranks (Qwen splits numbers into digits).
KNOWN = [
    ("Hello world", [9707, 1879]),
    ("你好", [108386]),
    ("user", [872]),
    ("assistant", [77091]),
    ("system", [8948]),
    ("\n", [198]),
    (" 2024", [220, 17, 15, 17, 19]),
    ("<|im_start|>user\nhi<|im_end|>", [151644, 872, 198, 6023, 151645]),
]


@pytest.mark.parametrize("text,ids", KNOWN, ids=[repr(t) for t, _ in KNOWN])
def test_known_qwen2_ids(text, ids):
    assert tok().encode(text) == ids


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_special_tokens_at_real_ids(arch):
    t = tok(arch)
    specials = special_tokens(arch)
    assert specials["<|endoftext|>"] == 151643 and specials["<|im_end|>"] == 151645
    assert specials["<|vision_start|>"] == 151652 and specials["<|image_pad|>"] == 151655
    assert specials["</tool_call>"] == 151658 and specials["<|file_sep|>"] == 151664
    if arch == "qwen3_vl":
        assert specials["<tool_response>"] == 151665 and specials["</think>"] == 151668
    else:
        assert "<think>" not in specials
    for name, want in specials.items():
        assert t.convert_tokens_to_ids(name) == want
        assert t.encode(name) == [want], f"{name} split into {t.encode(name)}"
    assert len(t) == 151643 + len(specials)
    assert t.eos_token_id == 151645 and t.pad_token_id == 151643


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_arbitrary_text(text):
    import unicodedata

    t = tok()
    # The Qwen tokenizers NFC-normalise, so the round trip is exact up to NFC.
    assert t.decode(t.encode(text)) == unicodedata.normalize("NFC", text)


SPECIAL_NAMES = sorted(special_tokens("qwen3_vl"))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(SPECIAL_NAMES), st.text(alphabet="ab <|>_/\n", max_size=8)), max_size=12))
def test_special_tokens_never_split(pieces):
    t = tok("qwen3_vl")
    text = "".join(pieces)
    ids = t.encode(text)
    specials = special_tokens("qwen3_vl")
    assert sum(text.count(s) for s in specials) == sum(1 for i in ids if i >= 151643)
    for i in ids:  # every special id decodes to exactly its token, never to a piece of one
        if i >= 151643:
            assert t.decode([i]) in specials
    assert t.decode(ids) == text
