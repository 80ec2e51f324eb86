"""The protobuf bodies of the Tinker wire (SDK 0.38), as frozen dataclasses on this side of the hop.

In: ``forward_backward`` (``application/x-protobuf``, maybe zstd) → :class:`ForwardBackwardCall`.
Out: ``ForwardBackwardOutput`` and ``SampleResponse`` bytes, which the SDK accepts only as protobuf
from ``retrieve_future``. Tokens travel as little-endian int32, logprobs as float32 (NaN where a
position has none). The JSON ``sample`` prompt is converted to the same chunk types here too.

Light: numpy and the SDK's compiled ``.proto`` (``tinker.proto``); no torch.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from vlrl.errors import BadInputError

StopReason = Literal["stop", "length"]


@dataclass(frozen=True)
class TextChunk:
    """Encoded text: token ids, exactly as the model sees them."""

    tokens: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class ImageChunk:
    """An image (PNG or JPEG bytes) standing for ``expected_tokens`` ``<|image_pad|>`` positions."""

    data: bytes
    format: str
    expected_tokens: int | None


Chunk = TextChunk | ImageChunk


@dataclass(frozen=True)
class Datum:
    """One sequence: its chunks and its per-token loss inputs (``target_tokens``, ``weights``, ...), each ``[N]``."""

    chunks: tuple[Chunk, ...]
    inputs: Mapping[str, np.ndarray]


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded ``forward_backward`` request (``forward_only`` for the SDK's ``forward``)."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_config: Mapping[str, float]
    forward_only: bool
    data: tuple[Datum, ...]


@dataclass(frozen=True)
class SampledSequence:
    """One sample: token ids ``[T]`` and their logprobs ``[T]`` (engine logprob contract)."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: StopReason


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Parse a ``ForwardBackwardRequest`` body; :class:`BadInputError` names what is malformed."""
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 — protobuf raises DecodeError and friends
        raise BadInputError(f"forward_backward body is not a ForwardBackwardRequest protobuf ({exc})") from None
    config = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "number":
            config[k] = float(v.number)
        elif v.WhichOneof("value") is not None:
            raise BadInputError(f"loss_fn_config[{k!r}]: only numbers are supported, got text {v.text!r}")
    data = tuple(_datum(d, i) for i, d in enumerate(msg.data))
    return ForwardBackwardCall(
        model_id=msg.model_id,
        seq_id=int(msg.seq_id),
        loss_fn=msg.loss_fn,
        loss_config=config,
        forward_only=bool(msg.forward_only),
        data=data,
    )


def _datum(d: Any, index: int) -> Datum:
    if len(d.model_input_spans) or len(d.loss_fn_input_spans):
        raise BadInputError(f"datum {index}: provenance spans are not supported")
    chunks: list[Chunk] = []
    for c in d.model_input:
        kind = c.WhichOneof("chunk")
        if kind == "encoded_text":
            chunks.append(TextChunk(tuple(np.frombuffer(c.encoded_text.tokens, dtype="<i4").tolist())))
        elif kind == "image":
            im = c.image
            chunks.append(
                ImageChunk(
                    bytes(im.data), im.format, int(im.expected_tokens) if im.HasField("expected_tokens") else None
                )
            )
        else:
            raise BadInputError(f"datum {index}: chunk type {kind!r} is not supported (text and image only)")
    inputs = {name: _tensor(t, f"datum {index} loss_fn_inputs[{name!r}]") for name, t in d.loss_fn_inputs.items()}
    return Datum(tuple(chunks), inputs)


def _tensor(t: Any, where: str) -> np.ndarray:
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: "<f4", pb.DTYPE_INT64: "<i8", pb.DTYPE_INT32: "<i4"}
    if t.HasField("sparse_csr"):
        raise BadInputError(f"{where}: sparse tensors are not supported (send dense)")
    if t.dtype not in dtypes:
        raise BadInputError(f"{where}: dtype {t.dtype} is not supported (float32, int64, int32)")
    arr = np.frombuffer(t.dense, dtype=dtypes[t.dtype])
    shape = tuple(t.shape) or (arr.size,)
    if int(np.prod(shape)) != arr.size:
        raise BadInputError(f"{where}: shape {list(shape)} does not match {arr.size} values")
    return arr.reshape(shape).copy()


def chunks_from_json(model_input: Mapping[str, Any]) -> tuple[Chunk, ...]:
    """The chunks of a JSON ``ModelInput`` (the ``sample`` route): ``{"chunks": [{"type": ...}, ...]}``."""
    out: list[Chunk] = []
    for i, c in enumerate(model_input.get("chunks") or ()):
        kind = c.get("type")
        if kind == "encoded_text":
            out.append(TextChunk(tuple(int(t) for t in c["tokens"])))
        elif kind == "image":
            data = c["data"]
            raw = base64.b64decode(data) if isinstance(data, str) else bytes(data)
            expected = c.get("expected_tokens")
            out.append(ImageChunk(raw, str(c["format"]), None if expected is None else int(expected)))
        else:
            raise BadInputError(f"prompt chunk {i}: type {kind!r} is not supported (encoded_text and image only)")
    return tuple(out)


def encode_forward_backward_output(outputs: Sequence[Mapping[str, np.ndarray]], metrics: Mapping[str, float]) -> bytes:
    """``ForwardBackwardOutput`` bytes: one ``ArrayRecord`` with each field batched over the data
    (float32 values, per-datum byte offsets)."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    if outputs:
        record = msg.loss_fn_outputs.add()
        record.num_datums = len(outputs)
        for name in outputs[0]:
            arrays = [np.ascontiguousarray(o[name], dtype="<f4").reshape(-1) for o in outputs]
            offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype("<i8")
            bt = record.fields[name]
            bt.data = b"".join(a.tobytes() for a in arrays)
            bt.offsets = offsets.tobytes()
            bt.dtype = pb.DTYPE_FLOAT32
    return msg.SerializeToString()


def encode_sample_response(sequences: Sequence[SampledSequence]) -> bytes:
    """``SampleResponse`` bytes: per sequence int32 tokens, float32 logprobs and the stop reason."""
    pb = _pb()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    msg = pb.SampleResponse()
    for s in sequences:
        seq = msg.sequences.add()
        seq.stop_reason = reasons[s.stop_reason]
        seq.tokens = np.asarray(s.tokens, dtype="<i4").tobytes()
        seq.logprobs = np.asarray(s.logprobs, dtype="<f4").tobytes()
    return msg.SerializeToString()
