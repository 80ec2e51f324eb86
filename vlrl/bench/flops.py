"""Model FLOPs of a training step and the peak FLOP/s of known devices: MFU = achieved / peak.

Light module: no torch import.
"""

from __future__ import annotations

from collections.abc import Iterable

FORMULA = (
    "train FLOPs = 6 * N_lm * T + 6 * N_vis * T_vis; N_lm = language-model parameters without the input "
    "embedding table (a lookup, no matmul; the LM head counted even when tied), T = tokens in the rows "
    "(prompt and reply, every token is forwarded and back-propagated), N_vis = vision tower parameters "
    "(patch embedding, blocks, merger), T_vis = patches (pixel_values rows); attention score FLOPs left out. "
    "MFU = train FLOPs / update seconds / peak FLOP/s of the device at the weights' dtype."
)

PEAK_FLOPS: dict[str, dict[str, float]] = {
    # Dense (no sparsity) tensor-core peaks from the vendors' data sheets, SXM parts; float32 is the
    # plain-fp32 peak (vlrl keeps TF32 off, for the fp32 agreement bounds).
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
}


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """Peak FLOP/s for a device name (``torch.cuda.get_device_name()``) at ``dtype``; None when unknown (CPUs)."""
    if not device_name:
        return None
    for key, table in PEAK_FLOPS.items():
        if key in device_name.upper():
            return table.get(dtype)
    return None


def count_params(named: Iterable[tuple[str, int]], tied_head: int = 0) -> tuple[int, int]:
    """``(N_lm, N_vis)`` from ``(parameter name, numel)`` pairs of a Qwen-VL model (see :data:`FORMULA`).

    ``tied_head``: the LM head's size when it shares the embedding's tensor (``named_parameters`` lists a
    tied tensor once, under the embedding's name), so the head's matmul is still counted."""
    n_lm, n_vis = tied_head, 0
    for name, numel in named:
        if ".visual." in f".{name}":
            n_vis += numel
        elif "embed_tokens" not in name:
            n_lm += numel
    return n_lm, n_vis


def train_flops(n_lm: int, tokens: int, n_vis: int, patches: int) -> float:
    """FLOPs of one forward + backward over ``tokens`` tokens and ``patches`` vision patches (:data:`FORMULA`)."""
    return 6.0 * n_lm * tokens + 6.0 * n_vis * patches
