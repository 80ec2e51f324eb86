"""Fused elementwise kernels for half-precision Qwen-VL models on CUDA: RMSNorm, SwiGLU and rotary embeddings.

Why (benchmarks/results/train_profile/, the bench's 2b update on an H200): 18k kernel launches per update, of
which ~4k ``mul`` and ~5.5k ``copy_`` (RMSNorm's fp32 round trip, rotary's ``rotate_half``, SwiGLU's activation
and product, forward and backward), about 0.2 s of the update's 0.65 s of kernels moving the same activations
through memory again and again, and as much host time launching them. Each function below is transformers' own
math, compiled by ``torch.compile`` (inductor) into one kernel forward and one or two backward, so the tensors are
read once; the matrix products and attention are untouched.

Measured (H200, 2b, bf16): in one process (benchmarks/results/train_profile/h200_d2de0f4.json) the update's
kernels 0.646 → 0.527 s and its wall 0.831 → 0.740 s; the bench batch's logprobs vs eager: mean |Δ| 0.021, max 0.10
(bf16 rounding order). But each compiled call pays dynamo's cache lookup and guards on the host (~45 µs in the
profile, 484 calls a forward), more than the few eager kernels it replaces when the tensors are small. ``vlrl bench``
on one lease (bench_h200_2b_9a1f7f3_eager.json / _fused.json): decoding 47.9 / 337 / 2,552 / 6,892 → 37.3 / 302 /
1,918 / 5,727 tok/s at 1 / 8 / 64 / 256 sequences, the train step's MFU 24.7 / 24.2 → 23.7 / 26.0 % (padded /
packed), peak memory 69.2 → 61.4 GiB. Rollouts pay more than training gains, so it is opt-in
(``model.kernels = "fused"``) until the compiled regions are larger than one function.

Where: :func:`install` swaps the forward of a model *instance*'s RMSNorm and gated-MLP modules, and the rotary
functions of the modeling modules it knows (:data:`ROTARY`), for wrappers that take the fused path only for
half-precision CUDA inputs and call transformers' own code otherwise, so CPU and fp32 runs are unchanged bit for
bit. The engine and the trainer share the instance, so rollout and training run the same kernels (inductor
rounds bf16 intermediates differently from eager: one more reason both sides must).
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from typing import Literal

import torch

Kernels = Literal["fused", "eager"]
"""``fused``: :func:`install` at load (only half-precision CUDA inputs change path); ``eager``: transformers' own."""

MARK = "_vlrl_fused"
"""Attribute set on every wrapper :func:`install` makes (idempotence, and :func:`uninstall`)."""

ROTARY = {
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl": ("apply_rotary_pos_emb", "apply_rotary_pos_emb_vision"),
}
"""Modeling modules whose rotary functions are transformers' plain rotate-half math (tests/models/test_fused.py
checks each against the original, bit for bit, on CPU)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen's RMSNorm: ``x [..., H]`` normalised in fp32, rounded to ``x``'s dtype, then scaled by ``weight [H]``."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's elementwise part: ``silu(gate) * up``, both ``[..., I]``."""
    return torch.nn.functional.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Text rotary: ``q``, ``k`` ``[B, heads, L, D]``, ``cos``, ``sin`` ``[B, L, D]`` (mRoPE sections merged)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def rotary_vision(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vision rotary, in fp32: ``q``, ``k`` ``[T, heads, D]``, ``cos``, ``sin`` ``[T, D]``."""
    dq, dk = q.dtype, k.dtype
    q, k = q.float(), k.float()
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    return (q * cos + _rotate_half(q) * sin).to(dq), (k * cos + _rotate_half(k) * sin).to(dk)


HALF = (torch.bfloat16, torch.float16)


def eligible(x: torch.Tensor) -> bool:
    """The fused path's inputs: half precision on CUDA (FSDP's fp32-master models compute in bf16 there too)."""
    return x.is_cuda and x.dtype in HALF


@functools.cache
def compiled(fn: Callable) -> Callable:
    """``fn`` compiled once per process, dynamic in its shapes (sequence lengths change every batch).

    Each function meets a few static variants (text ``[B, L, H]`` and vision ``[T, H]`` inputs, with and
    without autograd, one-token decode steps): more than dynamo's default of 8 recompiles per function, after
    which it would silently run eager again."""
    from torch._dynamo import config

    config.recompile_limit = max(config.recompile_limit, 64)
    return torch.compile(fn, dynamic=True, fullgraph=True)


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if eligible(hidden_states):
        return compiled(rms_norm)(hidden_states, self.weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    if eligible(x):
        return self.down_proj(compiled(silu_mul)(self.gate_proj(x), self.up_proj(x)))
    return type(self).forward(self, x)


def _is_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def _is_swiglu(module: torch.nn.Module) -> bool:
    names = ("gate_proj", "up_proj", "down_proj")
    act = getattr(module, "act_fn", None)
    return all(hasattr(module, n) for n in names) and type(act).__name__ in ("SiLU", "SiLUActivation")


def _rotary_wrapper(original: Callable, fused: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(q, k, cos, sin, *args, **kwargs):
        if not args and not kwargs and eligible(q):
            return compiled(fused)(q, k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)

    setattr(wrapper, MARK, original)
    return wrapper


def install(model: torch.nn.Module) -> int:
    """Route ``model``'s RMSNorms, SwiGLU MLPs and (process-wide, per :data:`ROTARY`) rotary functions through the
    fused kernels for half-precision CUDA inputs; returns how many modules changed. Idempotent."""
    count = 0
    for module in model.modules():
        patch = _norm_forward if _is_norm(module) else _mlp_forward if _is_swiglu(module) else None
        if patch is not None and not hasattr(module, MARK):
            module.forward = types.MethodType(patch, module)  # an instance attribute: shadows the class's forward
            setattr(module, MARK, True)
            count += 1
    fused = {"apply_rotary_pos_emb": rotary, "apply_rotary_pos_emb_vision": rotary_vision}
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for name, functions in ROTARY.items():
        if name.rsplit(".", 1)[-1] != f"modeling_{model_type}":
            continue
        modeling = importlib.import_module(name)
        for fn in functions:
            original = getattr(modeling, fn)
            if not hasattr(original, MARK):
                setattr(modeling, fn, _rotary_wrapper(original, fused[fn]))
    return count


def uninstall(model: torch.nn.Module) -> None:
    """Undo :func:`install` on ``model`` and on the modeling modules (for diagnosis and the profile's variants)."""
    for module in model.modules():
        if hasattr(module, MARK):
            del module.forward
            delattr(module, MARK)
    for name, functions in ROTARY.items():
        modeling = importlib.import_module(name)
        for fn in functions:
            original = getattr(getattr(modeling, fn), MARK, None)
            if original is not None:
                setattr(modeling, fn, original)
