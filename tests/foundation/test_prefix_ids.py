"""Kept prefix ids (``vlrl.render.prefix_ids``): a conversation's ids tokenized from where its last render left off
are the tokenizer's own ids of the whole text, turn after turn, across branches, for any text around the turn
boundaries; a tokenizer the split does not hold for is tokenized whole."""

from __future__ import annotations

import random

import pytest

from vlrl.render.prefix_ids import BOUNDARY, PrefixIds

FRAGMENTS = ["a", " ", "\n", "  \n", "héllo", "🙂", "<|im_end|>", "<|image_pad|>", "x\n\n", " up", "\t", "'s", "123"]


def whole(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


def _turns(rng: random.Random, n: int) -> list[str]:
    """``n`` texts, each the last one extended by a turn whose pieces mix text, special tokens and whitespace."""
    text, out = "<|im_start|>system\nYou are here.<|im_end|>\n", []
    for _ in range(n):
        body = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12)))
        text += f"{BOUNDARY}user\n{body}<|im_end|>\n"
        out.append(text + f"{BOUNDARY}assistant\n")
        text += f"{BOUNDARY}assistant\n{rng.choice(FRAGMENTS)}{body[:3]}<|im_end|>\n"
    return out


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_a_growing_conversation_gets_the_tokenizers_ids_each_turn(tiny, arch):
    tokenizer = tiny(arch).tokenizer
    ids = PrefixIds(tokenizer)
    assert ids.enabled
    texts = _turns(random.Random(0), 30)
    for text in texts:
        assert ids.ids(text) == whole(tokenizer, text)
    assert ids.tokenized_chars < len(texts[-1]) * 1.5  # each turn's new text, not the whole conversation again
    assert sum(map(len, texts)) > 10 * len(texts[-1])


def test_branches_and_unrelated_conversations_interleaved(tiny):
    """GRPO's repeats share a first turn and then differ; other episodes' renders come in between."""
    tokenizer = tiny("qwen2_5_vl").tokenizer
    ids = PrefixIds(tokenizer)
    rng = random.Random(1)
    convs = [_turns(random.Random(s), 12) for s in (2, 3, 4)]
    shared = convs[0][0]
    convs += [
        [shared] + [shared + t for t in _turns(random.Random(5), 8)],
        [shared] + [shared + t for t in _turns(random.Random(6), 8)],
    ]
    order = [(c, k) for c, conv in enumerate(convs) for k in range(len(conv))]
    rng.shuffle(order)
    order.sort(key=lambda ck: ck[1])  # turn by turn, conversations in a random order each turn
    for c, k in order:
        assert ids.ids(convs[c][k]) == whole(tokenizer, convs[c][k]), (c, k)


def test_a_kept_prefix_is_only_used_by_texts_that_start_with_it(tiny):
    tokenizer = tiny("qwen2_5_vl").tokenizer
    ids = PrefixIds(tokenizer)
    first = f"{BOUNDARY}user\nleft<|im_end|>\n{BOUNDARY}assistant\n"
    ids.ids(first)
    other = f"{BOUNDARY}user\nleft <|im_end|>\n{BOUNDARY}assistant\nup<|im_end|>\n{BOUNDARY}user\n"
    assert ids.ids(other) == whole(tokenizer, other)
    assert ids.ids("no boundary at all") == whole(tokenizer, "no boundary at all")
    assert ids.ids("") == whole(tokenizer, "")


class _WithBos:
    """The real tokenizer, adding a BOS id to every call (a tokenizer whose ids do not split at the boundary)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, text):
        return {"input_ids": [151643] + list(self.tokenizer(text)["input_ids"])}


def test_a_tokenizer_that_adds_tokens_is_tokenized_whole(tiny):
    tokenizer = _WithBos(tiny("qwen2_5_vl").tokenizer)
    ids = PrefixIds(tokenizer)
    assert not ids.enabled
    for text in _turns(random.Random(7), 5):
        assert ids.ids(text) == whole(tokenizer, text)
