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

Where: :func:`install` swaps the forward of a model *instance*'s RMSNorm, gated-MLP and (Qwen2.5-VL) attention
modules, named in :data:`NORMS`, :data:`MLPS` and :data:`ROTARY`, for wrappers that take the fused path only for
half-precision CUDA inputs and call transformers' own code otherwise, so CPU and fp32 runs are unchanged bit for
bit. Qwen2-VL and Qwen3-VL get fused norms and text MLPs only. The vLLM engine never runs these kernels: with it,
``kernels = "fused"`` only adds fused-vs-eager rounding to the agreement it checks. The embedded engine's model is
the trainer's instance (bench) or a deepcopy of it (``vlrl train``; a deepcopy rebinds the patched forwards to the
copy), so rollout and training run the same kernels (inductor rounds bf16 intermediates differently from eager: one
more reason both sides must).
"""

from __future__ import annotations

import contextvars
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

NORMS = {"Qwen2_5_VLRMSNorm", "Qwen2VLRMSNorm", "Qwen3VLTextRMSNorm"}
"""RMSNorm classes whose forward is :func:`rms_norm` (Qwen3-VL's text norms, q_norm / k_norm included)."""
MLPS = {"Qwen2MLP", "Qwen2_5_VLMLP", "Qwen3VLTextMLP"}
"""Gated MLP classes whose forward is ``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Qwen2.5-VL's vision MLP too)."""
ROTARY = {
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl": ("apply_rotary_pos_emb", "apply_rotary_pos_emb_vision"),
}
"""Modeling modules whose rotary functions are transformers' plain rotate-half math; their ``*Attention`` modules
get the fused rotary. Qwen2-VL and Qwen3-VL keep theirs, and their vision towers (LayerNorm, GELU MLPs) are
untouched. tests/foundation/test_fused.py checks every class and function here against transformers', bit for bit,
on CPU, and which modules each architecture routes."""

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("vlrl_fused_rotary", default=False)
"""Set while an installed attention module runs: the rotary functions are module globals of transformers, shared by
every model in the process, so the (process-wide) wrapper fuses only inside an installed model's attention."""


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


HALF: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
"""Half-precision model dtypes: on CUDA they take the fused kernels here and the fp32-output LM head
(``vlrl.engines.sampling.fp32_head``, which reads its own binding of this tuple)."""


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


def _attention_forward(self, *args, **kwargs):
    token = _ACTIVE.set(True)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        _ACTIVE.reset(token)


def _rotary_wrapper(original: Callable, fused: Callable) -> Callable:
    @functools.wraps(original)
    def wrapper(q, k, cos, sin, *args, **kwargs):
        if _ACTIVE.get() and not args and not kwargs and eligible(q):
            return compiled(fused)(q, k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)

    setattr(wrapper, MARK, original)
    return wrapper


def _patch_for(module: torch.nn.Module) -> Callable | None:
    cls = type(module)
    if cls.__name__ in NORMS:
        return _norm_forward
    if cls.__name__ in MLPS:
        return _mlp_forward
    if cls.__module__ in ROTARY and cls.__name__.endswith("Attention"):
        return _attention_forward
    return None


def install(model: torch.nn.Module) -> int:
    """Route ``model``'s RMSNorms, gated MLPs and rotary embeddings (:data:`NORMS`, :data:`MLPS`, :data:`ROTARY`)
    through the fused kernels for half-precision CUDA inputs; returns how many modules changed. Idempotent; other
    models in the process are unaffected (the rotary wrappers pass through outside an installed attention)."""
    count = 0
    for module in model.modules():
        patch = _patch_for(module)
        if patch is not None and not hasattr(module, MARK):
            module.forward = types.MethodType(patch, module)  # an instance attribute: shadows the class's forward
            setattr(module, MARK, True)
            count += 1
            if patch is _attention_forward:
                _wrap_rotary(type(module).__module__)
    return count


def _wrap_rotary(name: str) -> None:
    fused = {"apply_rotary_pos_emb": rotary, "apply_rotary_pos_emb_vision": rotary_vision}
    modeling = importlib.import_module(name)
    for fn in ROTARY[name]:
        original = getattr(modeling, fn)
        if not hasattr(original, MARK):
            setattr(modeling, fn, _rotary_wrapper(original, fused[fn]))


def uninstall(model: torch.nn.Module) -> None:
    """Undo :func:`install` on ``model`` (for diagnosis and the profile's variants). The rotary wrappers stay: they
    pass through for any model without installed attention."""
    for module in model.modules():
        if hasattr(module, MARK):
            del module.forward
            delattr(module, MARK)
