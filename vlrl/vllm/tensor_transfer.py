"""The trainer's tensors handed to a vLLM worker inside one ``/collective_rpc`` call, without a checkpoint on disk.

A payload is a base64 pickle of ``[(name, ref)]`` (names as the trainer's ``named_parameters()``, canonicalised
like the checkpoint's), each ``ref`` one of:

- ``("ipc", rebuild, args, gpu_uuid)``: a CUDA IPC handle of the trainer's tensor
  (``torch.multiprocessing.reductions.reduce_tensor``), rebuilt by the worker on the same physical GPU, which
  copies from it into its own weights (``reload_weights(weights_iterator=...)``) — trainer and server share a GPU;
  vLLM 0.26's own "ipc" weight-transfer backend would do the same but imports ray, which GPU hosts lack;
- ``("value", tensor)``: the tensor itself, pickled (CPU; small updates and tests).

The payload is unpickled by the worker: it runs behind the run's API key (``vlrl.vllm.auth``), like every
dev route, and ``/collective_rpc`` already calls any worker method. The sender keeps its tensors alive (the
second value :func:`encode_tensors` returns) until the call has returned.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from vlrl.engines.types import NamedTensors
from vlrl.vllm.checkpoint import canonical_name

Transport = Literal["cuda_ipc", "value"]


def gpu_uuid(device: Any) -> str:
    import torch

    return str(torch.cuda.get_device_properties(device).uuid)


def encode_tensors(named_tensors: NamedTensors, transport: Transport) -> tuple[str, list[Any]]:
    """``(payload, keep_alive)``; for ``cuda_ipc`` every tensor must already be on a CUDA device."""
    from torch.multiprocessing.reductions import reduce_tensor

    items: list[tuple[str, tuple]] = []
    keep: list[Any] = []
    pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    for name, tensor in pairs:
        t = tensor.detach().contiguous()
        if transport == "cuda_ipc":
            if not t.is_cuda:
                raise ValueError(
                    f"{name} is on {t.device}: cuda_ipc sends CUDA tensors (trainer and server on one GPU)"
                )
            rebuild, args = reduce_tensor(t)
            keep.append(t)
            items.append((canonical_name(name), ("ipc", rebuild, args, gpu_uuid(t.device))))
        else:
            items.append((canonical_name(name), ("value", t.cpu())))
    if not items:
        raise ValueError("no tensors to send")
    return base64.b64encode(pickle.dumps(items)).decode("ascii"), keep


def decode_tensors(payload: str) -> Iterator[tuple[str, Any]]:
    """In the worker: ``(name, tensor)`` per item; IPC tensors rebuilt on this process's current CUDA device,
    which must be the GPU they live on."""
    import torch

    for name, ref in pickle.loads(base64.b64decode(payload)):
        if ref[0] == "value":
            yield name, ref[1]
            continue
        _, rebuild, args, uuid = ref
        here = torch.cuda.current_device()
        if uuid != gpu_uuid(here):
            raise ValueError(
                f"{name} lives on GPU {uuid}, this vLLM worker on {gpu_uuid(here)}: CUDA IPC needs trainer and "
                "server on one GPU (use the checkpoint sync across GPUs)"
            )
        args = list(args)
        args[6] = here  # the device index in the sender's numbering -> this process's (reduce_tensor's layout)
        yield name, rebuild(*args)
