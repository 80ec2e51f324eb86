"""Protobuf serialization against the SDK's own converters (``tinker.proto``): what the SDK writes, vlrl reads;
what vlrl writes, the SDK reads — tokens, images, per-token inputs, NaN logprobs, ragged outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from vlrl.errors import BadInputError
from vlrl.tinker.wire import (
    ImageChunk,
    SampledSequence,
    TextChunk,
    chunks_from_json,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)

PNG = b"\x89PNG\r\n\x1a\nnot really"


def _request(**kw) -> types.ForwardBackwardRequest:
    chunks = [
        types.EncodedTextChunk(tokens=[1, 2, 151652]),
        types.ImageChunk(data=PNG, format="png", expected_tokens=4),
        types.EncodedTextChunk(tokens=[151653, 7]),
    ]
    datum = types.Datum(
        model_input=types.ModelInput(chunks=chunks),
        loss_fn_inputs={
            "target_tokens": np.arange(9, dtype=np.int64),
            "weights": np.linspace(0, 1, 9, dtype=np.float32),
        },
    )
    return types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[datum], loss_fn=kw.get("loss_fn", "ppo"), loss_fn_config=kw.get("config")
        ),
        model_id="m:train:0",
        seq_id=5,
    )


def test_the_sdks_forward_backward_request_decodes_exactly():
    msg = forward_backward_request_to_proto(_request(config={"clip_low_threshold": 0.7}))
    msg.forward_only = True
    call = decode_forward_backward(msg.SerializeToString())
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("m:train:0", 5, "ppo", True)
    assert call.loss_config == {"clip_low_threshold": pytest.approx(0.7)}
    (datum,) = call.data
    assert datum.chunks == (TextChunk((1, 2, 151652)), ImageChunk(PNG, "png", 4), TextChunk((151653, 7)))
    assert datum.inputs["target_tokens"].dtype == np.int64
    np.testing.assert_array_equal(datum.inputs["target_tokens"], np.arange(9))
    np.testing.assert_array_equal(datum.inputs["weights"], np.linspace(0, 1, 9, dtype=np.float32))


def test_an_image_without_expected_tokens_decodes_as_unknown():
    req = _request()
    req.forward_backward_input.data[0].model_input.chunks[1] = types.ImageChunk(data=PNG, format="jpeg")
    call = decode_forward_backward(forward_backward_request_to_proto(req).SerializeToString())
    assert call.data[0].chunks[1] == ImageChunk(PNG, "jpeg", None)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (
            lambda m: (
                m.data[0].loss_fn_inputs["weights"].ClearField("dense")
                or m.data[0].loss_fn_inputs["weights"].sparse_csr.SetInParent()
            ),
            "sparse",
        ),
        (lambda m: m.data[0].model_input.add().dmel.SetInParent(), "dmel"),
        (lambda m: m.data[0].model_input_spans.add(), "provenance"),
        (lambda m: m.data[0].loss_fn_inputs["weights"].shape.extend([4]), "shape"),
        (lambda m: m.loss_fn_config_v2["mode"].__setattr__("text", "x"), "only numbers"),
    ],
)
def test_unsupported_or_inconsistent_requests_are_refused_by_name(mutate, match):
    msg = forward_backward_request_to_proto(_request())
    mutate(msg)
    with pytest.raises(BadInputError, match=match):
        decode_forward_backward(msg.SerializeToString())


def test_garbage_is_not_a_request():
    with pytest.raises(BadInputError, match="not a ForwardBackwardRequest"):
        decode_forward_backward(b"\xff\xff\xff\xff garbage")


def test_forward_backward_output_reads_back_in_the_sdk_ragged_and_with_nan():
    outputs = [
        {"logprobs": np.array([-1.5, np.nan, -0.25], dtype=np.float32)},
        {"logprobs": np.array([-3.0], dtype=np.float32)},
    ]
    out = deserialize_forward_backward_output(encode_forward_backward_output(outputs, {"loss:sum": 4.75}))
    assert out.metrics == {"loss:sum": 4.75}
    assert out.loss_fn_output_type == "ArrayRecord"
    got = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
    np.testing.assert_array_equal(got[0], outputs[0]["logprobs"])
    np.testing.assert_array_equal(got[1], outputs[1]["logprobs"])
    assert math.isnan(got[0][1])
    assert deserialize_forward_backward_output(encode_forward_backward_output([], {})).loss_fn_outputs == []


def test_sample_response_reads_back_in_the_sdk():
    seqs = [SampledSequence((5, 151645), (-0.5, -1.25), "stop"), SampledSequence((9,) * 3, (-2.0,) * 3, "length")]
    res = deserialize_sample_response(encode_sample_response(seqs))
    assert [s.tokens for s in res.sequences] == [[5, 151645], [9, 9, 9]]
    assert [s.stop_reason for s in res.sequences] == ["stop", "length"]
    assert res.sequences[0].logprobs == [-0.5, -1.25]
    assert pb.SampleResponse.FromString(encode_sample_response(seqs)).sequences[1].stop_reason == pb.STOP_REASON_LENGTH


def test_the_json_sample_prompt_round_trips_image_bytes():
    model_input = types.ModelInput(
        chunks=[types.EncodedTextChunk(tokens=[3, 4]), types.ImageChunk(data=PNG, format="png", expected_tokens=16)]
    )
    assert chunks_from_json(model_input.model_dump(mode="json")) == (TextChunk((3, 4)), ImageChunk(PNG, "png", 16))
    with pytest.raises(BadInputError, match="not supported"):
        chunks_from_json({"chunks": [{"type": "image_asset_pointer", "location": "s3://x"}]})
