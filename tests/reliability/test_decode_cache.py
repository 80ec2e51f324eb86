"""Data URIs decoded once: a conversation's earlier images are not decoded (or hashed) again on its next turn, the
cache keeps within its pixel budget, hands out copies, and never lets an image past limits it was not checked
against."""

from __future__ import annotations

import numpy as np
import pytest

import vlrl.messages as M
from vlrl.errors import BadInputError
from vlrl.image_decode import ImageLimits
from vlrl.lru import LruBytes
from vlrl.messages import image_part, prepare_messages, user_message


def frame(seed: int, side: int = 64):
    return np.random.default_rng(seed).integers(0, 256, size=(side, side, 3), dtype=np.uint8)


@pytest.fixture
def decodes(monkeypatch):
    """A fresh cache, and the count of data URIs actually decoded."""
    monkeypatch.setattr(M, "_DECODED", LruBytes(256 * 2**20))
    calls: list[str] = []
    real = M.decode_data_uri

    def counting(url, limits, where):
        calls.append(url)
        return real(url, limits, where)

    monkeypatch.setattr(M, "decode_data_uri", counting)
    return calls


def test_a_turn_decodes_only_its_new_image(decodes):
    history = [user_message(image_part(frame(0)), "first")]
    first = prepare_messages(history)
    assert len(decodes) == 1
    for turn in range(1, 6):
        history += [{"role": "assistant", "content": "right"}, user_message(image_part(frame(turn)), "next")]
        prepared = prepare_messages(history)
        assert len(decodes) == 1 + turn  # the earlier images came from the cache
    again = prepare_messages(history[:1])
    assert again.hashes == first.hashes and again.messages == first.messages
    assert np.array_equal(np.asarray(again.images[0]), frame(0))
    assert len(prepared.hashes) == len(prepared.images) == 6
    assert prepared.hashes == tuple(M.image_hash(im) for im in prepared.images)


def test_the_cache_keeps_within_its_pixel_budget_and_hands_out_copies(decodes, monkeypatch):
    monkeypatch.setattr(M, "_DECODED", LruBytes(2 * 64 * 64 * 3))  # room for two frames
    parts = [image_part(frame(k)) for k in range(3)]
    for part in parts:
        prepare_messages([user_message(part)])
    assert M._DECODED.bytes <= M._DECODED.max_bytes and len(M._DECODED) == 2
    prepare_messages([user_message(parts[0])])  # the oldest was dropped: decoded again
    assert len(decodes) == 4
    image = prepare_messages([user_message(parts[0])]).images[0]
    image.paste((0, 0, 0), (0, 0, 64, 64))  # a caller scribbles on its image
    assert np.array_equal(np.asarray(prepare_messages([user_message(parts[0])]).images[0]), frame(0))
    assert len(decodes) == 4


def test_an_image_cached_under_loose_limits_is_still_refused_under_strict_ones(decodes):
    part = image_part(frame(1, side=96))
    prepare_messages([user_message(part)])
    with pytest.raises(BadInputError, match="pixels"):
        prepare_messages([user_message(part)], limits=ImageLimits(max_pixels=64 * 64))
