"""One call under ``torch.profiler``: wall seconds, the device's busy seconds and the top ops (benchmarks/*_profile.py).

Device busy far below the wall means the host (kernel launches, Python) is the bound, not the kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def table(prof: Any, sort: str, n: int = 25) -> list[dict]:
    """The ``n`` ops with the most ``sort`` (``self_cpu_time_total`` or ``self_device_time_total``)."""
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, sort), reverse=True)[:n]
    return [
        {
            "name": e.key[:90],
            "calls": e.count,
            "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
            "cpu_total_ms": round(e.cpu_time_total / 1e3, 2),
            "self_device_ms": round(e.self_device_time_total / 1e3, 2),
        }
        for e in rows
    ]


def profiled(call: Callable[[], Any], device: str) -> dict:
    """``call`` once to warm, once timed, once under the profiler: ``seconds`` (the timed call),
    ``profiled_seconds``, ``device_busy_seconds`` (its kernels' sum), ``host_syncs`` (stream / device
    synchronisations) and the top ops by host and by device."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from vlrl.bench.env import now

    call()  # warm
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    t0 = now(device)
    call()
    plain = now(device) - t0
    with profile(activities=activities) as prof:
        t0 = now(device)
        call()
        wall = now(device) - t0
    events = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    syncs = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize"))
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {
        "seconds": round(plain, 4),
        "profiled_seconds": round(wall, 4),
        "device_busy_seconds": round(kernels / 1e6, 4),
        "host_syncs": syncs,
        "by_host": table(prof, "self_cpu_time_total"),
        "by_device": table(prof, "self_device_time_total"),
    }
