"""A torch.profiler summary of one call, as the FSDP benchmarks record it (``benchmarks/fsdp_throughput.py``,
``benchmarks/fsdp_vs_plain.py``: their ``--profile``)."""

from __future__ import annotations

import re
import time

import torch


def profiled(fn, d, top: int = 25) -> tuple:
    """``fn()`` under torch.profiler: its result, and the ``top`` ops by self CPU time and by self device
    time (``{op: [calls, self_ms]}``), vlrl's / FSDP's / the optimizer's ranges, the wall time and the
    device's busy time (all kernels and copies: how much of the wall the device worked)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if d.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        out = fn()
        if d.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()

    def table(key: str) -> dict:
        ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
        return {e.key: [e.count, round(getattr(e, key) / 1e3, 3)] for e in ranked}

    device_key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    total_device = device_key.replace("self_", "")
    labels: dict[str, list] = {}  # vlrl's and FSDP's ranges (all blocks' summed), the optimizer: whole times
    for e in events:
        if e.key.startswith(("vlrl.", "FSDP::", "Optimizer.")):
            key = re.sub(r" (\(.*\)|for .*)$", "", e.key)
            row = labels.setdefault(key, [0, 0.0, 0.0])
            row[0] += e.count
            row[1] += e.cpu_time_total / 1e3
            row[2] += getattr(e, total_device, 0) / 1e3
    labels = {k: [c, round(cpu, 3), round(dev, 3)] for k, (c, cpu, dev) in labels.items()}
    busy = sum(getattr(e, device_key) for e in events if e.device_type == DeviceType.CUDA) / 1e3
    return out, {
        "wall_ms": round(wall * 1e3, 3),
        "device_busy_ms": round(busy, 3),
        "self_cpu_ms": table("self_cpu_time_total"),
        "self_device_ms": table(device_key),
        "labels": labels,
    }
