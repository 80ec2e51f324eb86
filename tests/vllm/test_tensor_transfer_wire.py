"""The weight payload a vLLM worker decodes carries no pickle: a pickled payload (whose ``__reduce__`` would run
code) is refused without running it, and values round-trip bit for bit. Light: no vLLM server."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import pytest
import torch

from vlrl.vllm.checkpoint import canonical_name
from vlrl.vllm.tensor_transfer import decode_tensors, encode_tensors


class _Plant:
    """Unpickling this writes a file: proof that the decoder ran sender-chosen code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_a_pickled_weight_payload_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran.txt"
    payload = base64.b64encode(pickle.dumps([("w", ("value", _Plant(marker)))])).decode("ascii")
    with pytest.raises(ValueError, match="not vlrl-tensors/1 JSON"):
        list(decode_tensors(payload))
    assert not marker.exists(), "decoding the payload ran the pickle's code"


def test_a_raw_pickle_payload_is_refused_too(tmp_path):
    marker = tmp_path / "ran.txt"
    payload = pickle.dumps(_Plant(marker), protocol=0).decode("latin-1")
    with pytest.raises(ValueError, match="refused"):
        list(decode_tensors(payload))
    assert not marker.exists()


def test_values_round_trip_bit_for_bit_in_order():
    sent = {
        "model.embed_tokens.weight": torch.randn(5, 3, dtype=torch.bfloat16),
        "model.norm.weight": torch.randn(7),
        "scalar": torch.tensor(3.5, dtype=torch.float16),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(4, 6).t(),  # non-contiguous: sent as its values
    }
    payload, keep = encode_tensors(sent, "value")
    assert keep == []
    assert b"\x80" not in payload.encode() and json.loads(payload)["format"] == "vlrl-tensors/1"
    got = list(decode_tensors(payload))
    assert [n for n, _ in got] == [canonical_name(n) for n in sent]
    for (name, t), ref in zip(got, sent.values(), strict=True):
        assert t.dtype == ref.dtype and t.shape == ref.shape, name
        assert torch.equal(t, ref), name


def _doc(**change):
    payload, _ = encode_tensors({"w": torch.ones(2, 2)}, "value")
    doc = json.loads(payload)
    doc["items"][0].update(change)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "Tensor"}, "dtype 'Tensor' is not one of"),
        ({"dtype": "__import__"}, "dtype '__import__' is not one of"),
        ({"shape": [2, -2]}, "not a list of whole numbers"),
        ({"shape": [3, 3]}, "16 bytes for shape"),
        ({"kind": "pickle"}, "kind 'pickle' is not"),
        ({"data": "!!"}, "not base64"),
    ],
)
def test_malformed_items_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message):
        list(decode_tensors(_doc(**change)))


def test_another_format_is_refused():
    with pytest.raises(ValueError, match="format is 'other'"):
        list(decode_tensors(json.dumps({"format": "other", "items": []})))
