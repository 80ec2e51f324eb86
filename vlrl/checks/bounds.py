"""Every numeric bound of vlrl's numerical checks, per dtype, stated once with the measurement behind it.

The checks that use these: rollout-vs-trainer agreement (``vlrl.checks.agreement``, every RL step)
and batch invariance (``vlrl.checks.batch_invariance``: a prompt's logprobs alone vs in any batch).
A bound only moves with a new measurement written here; a check that fires is a cause to find first.

Light module: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgreementBounds:
    """Largest rollout-vs-trainer disagreement accepted (``AgreementBounds.for_dtype`` gives the defaults)."""

    max_abs: float
    """Largest |rollout − trainer| logprob over generated tokens."""
    mean_abs: float
    """Mean |Δ| over generated tokens."""
    k3: float
    """Mean k3 estimate of KL(rollout ‖ trainer) per token: mean(exp(r) − 1 − r), r = trainer − rollout."""
    vocab_kl: float
    """Largest KL over the whole vocabulary at a probed position (engine top-k + tail bucket)."""
    min_topk_overlap: float
    """Smallest tie-aware top-k overlap at a probed position (fraction of the engine's k ids)."""

    @classmethod
    def for_dtype(cls, dtype: Any) -> "AgreementBounds":
        """The agreement bounds of :data:`BOUNDS` for the model's weight dtype."""
        return bounds_for(dtype).agreement


@dataclass(frozen=True)
class DtypeBounds:
    agreement: AgreementBounds
    batch_invariance: float
    """Largest |Δ logprob| of one prompt's tokens generated alone vs in a batch with other prompts
    (same seed; compared while the sampled tokens agree, and over the shared top-k ids)."""


BOUNDS: dict[str, DtypeBounds] = {
    # fp32: both sides do the same fp32 math in different shapes (KV-cache decode vs one full forward,
    # batch of 1 vs many, left vs right padding). Measured, tiny models: CPU max |Δ| ≤ 1e-6, mean ≤
    # 2.4e-7, k3 ≤ 1.2e-13, vocabulary KL ≤ 1.3e-16, top-5 overlap 1.0; H100 (TF32 off, vlrl_sdpa)
    # maze2d after SFT max 3.8e-6 (benchmarks/results/gpu_correctness_h100/). Batch invariance: CPU
    # ≤ 2e-6, H100 ≤ 4e-6 (same results folder). The bounds leave more than a decade; the smallest
    # injected fault (positions without the grid, Qwen2-VL) gives 1.5e-3, the SDPA stride-0 kernel
    # bug 0.1–5.5.
    "float32": DtypeBounds(
        agreement=AgreementBounds(max_abs=1e-4, mean_abs=2e-5, k3=1e-7, vocab_kl=1e-6, min_topk_overlap=1.0),
        batch_invariance=1e-4),
    # bf16 (engine and trainer both bf16, as GPU users run): logits come out of bf16 matmuls whose
    # reduction order and rounding differ with the shape, so agreement holds only to bf16 noise.
    # Measured: tiny models on CPU max |Δ| ≤ 0.003, mean ≤ 4e-4; H100, maze2d after SFT (peaked logits)
    # and the batch-invariance property (GPU correctness results folder). Real checkpoints drift more:
    # SkyRL's e2e runs accept mean |Δ| ≈ 0.01–0.02; verl-omni quotes ~1e-3 for dense bf16. Defaults:
    # mean 0.01 (drift, the bound that matters), max 0.5 (a gross-error guard: rare tail tokens reach
    # a few tenths), k3 and vocabulary KL 1e-3. The temperature and vision faults of the fault tests
    # (mean |Δ| 0.03–0.06) are still caught in bf16; the positions fault on Qwen2/2.5 (3e-4) is not.
    "bfloat16": DtypeBounds(
        agreement=AgreementBounds(max_abs=0.5, mean_abs=0.01, k3=1e-3, vocab_kl=1e-3, min_topk_overlap=0.6),
        batch_invariance=0.25),
}
BOUNDS["float64"] = BOUNDS["float32"]
BOUNDS["float16"] = BOUNDS["half"] = BOUNDS["bfloat16"]


def bounds_for(dtype: Any) -> DtypeBounds:
    """:data:`BOUNDS` for a torch dtype or its name (``torch.bfloat16``, ``"bfloat16"``)."""
    name = str(dtype).replace("torch.", "")
    if name not in BOUNDS:
        raise ValueError(f"no bounds for dtype {dtype!r} (known: {', '.join(sorted(BOUNDS))}); "
                         "pass bounds explicitly")
    return BOUNDS[name]
