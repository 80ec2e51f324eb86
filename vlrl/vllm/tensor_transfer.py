"""The trainer's tensors handed to a vLLM worker inside one ``/collective_rpc`` call, without a checkpoint on disk.

A payload is a JSON object, never a pickle (the worker parses it, and anything that holds the run's key may send
one: a pickle would be code execution in the server):
``{"format": "vlrl-tensors/1", "items": [item, ...]}`` in the order sent, each item with its ``name`` (as the
trainer's ``named_parameters()``, canonicalised like the checkpoint's), ``dtype`` (a name from :data:`DTYPES`),
``shape`` and ``kind``:

- ``"ipc"``: a CUDA IPC handle of the trainer's tensor (``torch.multiprocessing.reductions.reduce_tensor``'s
  fields, the handles base64), rebuilt by the worker on the same physical GPU (``gpu``, its UUID), which copies
  from it into its own weights (``reload_weights(weights_iterator=...)``) — trainer and server share a GPU;
  vLLM 0.26's own "ipc" weight-transfer backend would do the same but imports ray, which GPU hosts lack;
- ``"value"``: the tensor's raw bytes (little-endian, C order), base64 in ``data`` (CPU; small updates and tests).

The worker checks every field (known dtype, whole-number shape, byte count matching it) and refuses anything else
with a ``ValueError`` naming the item. The sender keeps its tensors alive (the second value :func:`encode_tensors`
returns) until the call has returned.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from vlrl.engines.types import NamedTensors
from vlrl.vllm.checkpoint import canonical_name

Transport = Literal["cuda_ipc", "value"]

FORMAT = "vlrl-tensors/1"
# The dtypes a payload may name (torch attribute names); nothing else is looked up on ``torch``.
DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
)


def gpu_uuid(device: Any) -> str:
    import torch

    return str(torch.cuda.get_device_properties(device).uuid)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _dtype_name(name: str, dtype: Any) -> str:
    text = str(dtype).removeprefix("torch.")
    if text not in DTYPES:
        raise ValueError(f"{name}: dtype {dtype} cannot be sent (known: {', '.join(DTYPES)})")
    return text


def _ipc_item(name: str, t: Any) -> dict[str, Any]:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(t)
    (_, size, stride, offset, _, _, device, handle, size_bytes, offset_bytes, _, rc_handle, rc_offset, event, sync) = (
        args
    )
    return {
        "kind": "ipc",
        "stride": list(stride),
        "offset": int(offset),
        "device": int(device),
        "handle": _b64(handle),
        "storage_size_bytes": int(size_bytes),
        "storage_offset_bytes": int(offset_bytes),
        "ref_counter_handle": _b64(rc_handle),
        "ref_counter_offset": int(rc_offset),
        "event_handle": _b64(event),
        "event_sync_required": bool(sync),
        "gpu": gpu_uuid(t.device),
    }


def _value_bytes(t: Any) -> bytes:
    import torch

    flat = t.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes()
    if sys.byteorder != "little" and flat.element_size() > 1:  # pragma: no cover - every host we run on is LE
        raise ValueError("value transport needs a little-endian host")
    return raw


def encode_tensors(named_tensors: NamedTensors, transport: Transport) -> tuple[str, list[Any]]:
    """``(payload, keep_alive)``; for ``cuda_ipc`` every tensor must already be on a CUDA device."""
    items: list[dict[str, Any]] = []
    keep: list[Any] = []
    pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    for name, tensor in pairs:
        t = tensor.detach().contiguous()
        head = {"name": canonical_name(name), "dtype": _dtype_name(name, t.dtype), "shape": list(t.shape)}
        if transport == "cuda_ipc":
            if not t.is_cuda:
                raise ValueError(
                    f"{name} is on {t.device}: cuda_ipc sends CUDA tensors (trainer and server on one GPU)"
                )
            keep.append(t)
            items.append(head | _ipc_item(name, t))
        else:
            items.append(head | {"kind": "value", "data": _b64(_value_bytes(t))})
    if not items:
        raise ValueError("no tensors to send")
    return json.dumps({"format": FORMAT, "items": items}, separators=(",", ":")), keep


def _field(item: dict, key: str, kind: type, where: str) -> Any:
    value = item.get(key)
    # bool is an int subclass: an int field takes no bool, a bool field only a bool
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: field {key!r} is {value!r}, not {kind.__name__}")
    return value


def _ints(item: dict, key: str, where: str) -> list[int]:
    value = _field(item, key, list, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError(f"{where}: field {key!r} is {value!r}, not a list of whole numbers")
    return value


def _bytes(item: dict, key: str, where: str, *, optional: bool = False) -> bytes | None:
    value = item.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as e:
        raise ValueError(f"{where}: field {key!r} is not base64 ({e})") from None


def parse_payload(payload: str) -> list[dict[str, Any]]:
    """The payload's items, checked for shape only (no torch): refuses anything that is not this JSON format."""
    try:
        doc = json.loads(payload)
    except (TypeError, ValueError):
        raise ValueError(
            f"weight payload is not {FORMAT} JSON (starts {str(payload)[:24]!r}); refused, nothing was loaded"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("items"), list):
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"weight payload format is {got!r}, not {FORMAT!r}; refused, nothing was loaded")
    items = doc["items"]
    if not items:
        raise ValueError("weight payload holds no tensors")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"weight payload item {i} is {type(item).__name__}, not an object")
        where = f"weight payload item {i} ({item.get('name')!r})"
        _field(item, "name", str, where)
        if item.get("dtype") not in DTYPES:
            raise ValueError(f"{where}: dtype {item.get('dtype')!r} is not one of {', '.join(DTYPES)}")
        _ints(item, "shape", where)
        if item.get("kind") not in ("ipc", "value"):
            raise ValueError(f"{where}: kind {item.get('kind')!r} is not 'ipc' or 'value'")
    return items


def _value_tensor(item: dict, where: str) -> Any:
    import math

    import torch

    dtype = getattr(torch, item["dtype"])
    raw = _bytes(item, "data", where)
    assert raw is not None
    numel = math.prod(item["shape"])
    size = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * size:
        raise ValueError(f"{where}: {len(raw)} bytes for shape {item['shape']} of {item['dtype']} ({numel * size})")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(item["shape"])


def _ipc_tensor(item: dict, where: str) -> Any:
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    here = torch.cuda.current_device()
    uuid = _field(item, "gpu", str, where)
    if uuid != gpu_uuid(here):
        raise ValueError(
            f"{item['name']} lives on GPU {uuid}, this vLLM worker on {gpu_uuid(here)}: CUDA IPC needs trainer and "
            "server on one GPU (use the checkpoint sync across GPUs)"
        )
    for key in ("offset", "storage_size_bytes", "storage_offset_bytes", "ref_counter_offset"):
        _field(item, key, int, where)
    return rebuild_cuda_tensor(
        torch.Tensor,
        torch.Size(item["shape"]),
        tuple(_ints(item, "stride", where)),
        item["offset"],
        torch.storage.TypedStorage,  # what reduce_tensor's sender hands over (tensor._typed_storage())
        getattr(torch, item["dtype"]),
        here,  # the sender's device index is its own numbering: this process's device is the same GPU (uuid)
        _bytes(item, "handle", where, optional=True),
        item["storage_size_bytes"],
        item["storage_offset_bytes"],
        False,
        _bytes(item, "ref_counter_handle", where, optional=True),
        item["ref_counter_offset"],
        _bytes(item, "event_handle", where, optional=True),
        bool(_field(item, "event_sync_required", bool, where)),
    )


def decode_tensors(payload: str) -> Iterator[tuple[str, Any]]:
    """In the worker: ``(name, tensor)`` per item; IPC tensors rebuilt on this process's current CUDA device,
    which must be the GPU they live on. The whole payload is checked before the first tensor is yielded."""
    items = parse_payload(payload)
    for i, item in enumerate(items):
        where = f"weight payload item {i} ({item['name']!r})"
        yield item["name"], _value_tensor(item, where) if item["kind"] == "value" else _ipc_tensor(item, where)
