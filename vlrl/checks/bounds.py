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
    def for_dtype(cls, dtype: Any) -> AgreementBounds:
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
    # batch of 1 vs many, left vs right padding). Measured: tiny models on CPU max |Δ| ≤ 1e-6, mean ≤
    # 2.4e-7, k3 ≤ 1.2e-13, vocabulary KL ≤ 1.3e-16, top-5 overlap 1.0; H100 (TF32 off, vlrl_sdpa), maze2d
    # after SFT, 4 RL steps, 6.3k tokens a step at depths up to 2.7k: max 2.9e-6 in every depth bin.
    # Batch invariance (alone vs 4 arrangements, widths 1025–1857): CPU and H100 ≤ 9.6e-7, one and two kv
    # heads. The bounds leave more than a decade; the smallest injected fault (positions without the
    # grid, Qwen2-VL) gives 1.5e-3, the SDPA stride-0 kernel bug 2.0–2.3 (first tokens past 1k).
    "float32": DtypeBounds(
        agreement=AgreementBounds(max_abs=1e-4, mean_abs=2e-5, k3=1e-7, vocab_kl=1e-6, min_topk_overlap=1.0),
        batch_invariance=1e-4,
    ),
    # bf16 (engine and trainer both bf16, as GPU users run; LM head in fp32 on both sides): the decoder's
    # bf16 matmuls round differently in a 1-token decode step and a full-sequence forward. Measured on an
    # H100 (benchmarks/results/gpu_correctness_h100/): random-init 2b (28 layers), 384 tokens: mean |Δ|
    # 0.0158, p99 0.053, max 0.066, k3 1.6e-4 — and engine vs an fp32 copy of the same weights 0.022,
    # trainer vs it 0.022: the gap is bf16 noise on both sides, neither side is wrong. Tiny model after
    # maze SFT (peaked logits), 7.6k tokens: max 0.0065, mean 4.5e-4 (with a bf16 LM head: max 0.039,
    # mean 1.1e-3). Batch invariance: max 0.0078 (two bf16 ulps of a logprob near -2). Real checkpoints
    # drift more (SkyRL's e2e runs accept mean 0.01–0.02). Defaults: mean 0.03 (about twice the 2b
    # noise), max 0.5 (a gross-error guard: tail tokens reach a few tenths), k3 and vocabulary KL 1e-3,
    # batch invariance 0.25. What bf16 still catches: the kernel bug (2.0 on first tokens), a swapped
    # image or temperature on small models only where their mean |Δ| exceeds 0.03 — subtle faults are
    # the fp32 runs' job (the CPU suite and `pytest -m gpu` run both dtypes).
    "bfloat16": DtypeBounds(
        agreement=AgreementBounds(max_abs=0.5, mean_abs=0.03, k3=1e-3, vocab_kl=1e-3, min_topk_overlap=0.6),
        batch_invariance=0.25,
    ),
}
BOUNDS["float64"] = BOUNDS["float32"]
BOUNDS["float16"] = BOUNDS["half"] = BOUNDS["bfloat16"]


def bounds_for(dtype: Any) -> DtypeBounds:
    """:data:`BOUNDS` for a torch dtype or its name (``torch.bfloat16``, ``"bfloat16"``)."""
    name = str(dtype).replace("torch.", "")
    if name not in BOUNDS:
        raise ValueError(f"no bounds for dtype {dtype!r} (known: {', '.join(sorted(BOUNDS))}); pass bounds explicitly")
    return BOUNDS[name]
