"""vlrl's attention function for transformers models: SDPA with materialised key/value heads.

Why it exists (measured on an H100, torch 2.11, fp32): transformers' ``sdpa`` attention repeats the
key/value heads of a grouped-query model with ``expand`` — with one kv head that is a *view with
stride 0 on the head axis*. Given such k/v and an explicit mask (left padding, or any mask), SDPA's
memory-efficient CUDA kernel returned a wrong last query row (off by 2.4–4.1 in the output) at key
lengths 1025, 1409, 1857 and 2049, and right ones at 1408, 1410 and 1710; contiguous k/v, or the math
backend, were right. The embedded engine's left-padded prefill predicts the next token from exactly
that last row, so after SFT (peaked logits) the first token of late maze turns disagreed with the
trainer by up to 5.5 nats — and only for the batch widths that hit the bug. The trainer escaped
because it pads on the right. ``vlrl_sdpa`` hands SDPA contiguous k/v of the full head count
(``repeat_interleave``), so no forward of vlrl's depends on how a kernel treats zero strides; the
batch-invariance check (``vlrl.checks.batch_invariance``) is what would catch the next kernel of this
kind. Everything else is transformers' ``sdpa`` path (same mask function, same causal shortcut). A decode step (one
query row) attends with the query heads grouped by their kv head instead (:func:`grouped_decode`): the keys /
values as they are, no copies, no zero strides.

Packed rows (``vlrl.train.packing``): given ``vlrl_segments`` (the rows' lengths) the decoder's attention
runs causally within each row (varlen); without it nothing changes.

Vision towers (:data:`VISION`): transformers hands a Qwen-VL vision tower's images (or windows) to the attention
function in one call, with their boundaries (``cu_seqlens``), only for implementations whose name contains
"flash"; any other gets one call per image per block. On the H100 (2b, 24 images) that loop was 768 of a train
step's 992 attention calls, and the step was launch-bound (1.12 s of CPU time for 0.167 s of kernels).
:func:`vision_varlen_forward` takes the one call and runs one SDPA per run of equal-length segments
(``[n, H, L, D]``), the same attention as the loop. If a transformers version routes vision attention
differently, the tower simply keeps its loop through :func:`vlrl_sdpa_forward`.

Registered on import under :data:`ATTENTION` and :data:`VISION`; ``vlrl.models.load.load_model`` selects them.
"""

from __future__ import annotations

import itertools

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "vlrl_sdpa"
"""The attention implementation vlrl loads models with."""

VISION = "vlrl_sdpa_flash_api"
"""The vision towers' implementation: "flash" in the name is what makes transformers pass all images at once."""

CHOICES = (ATTENTION, "sdpa", "eager")
"""Attention implementations a run may ask for (``sdpa`` is transformers' own, kept for diagnosis)."""


def repeat_heads(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, H_kv, L, D] -> [B, H_kv * n_rep, L, D]``, materialised and contiguous (never a stride-0 view)."""
    if n_rep > 1:
        x = torch.repeat_interleave(x, n_rep, dim=1)
    return x.contiguous()


SEGMENTS = "vlrl_segments"
"""Keyword argument (through the model's ``**kwargs``) with the packed rows' lengths for :func:`vlrl_sdpa_forward`."""


def varlen_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    lengths: tuple[int, ...],
    scaling: float | None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Causal attention within each packed row: query / key / value ``[1, H, T, D]`` (kv heads already
    repeated), ``lengths`` the rows' token counts (sum ``T``) -> ``[1, H, T, D]``.

    One SDPA call per row with the causal flag and no mask: ``sum(n²)`` work instead of ``T²``, and the
    flash / cuDNN kernels stay eligible (a mask rules them out)."""
    parts = zip(*(x.split(list(lengths), dim=2) for x in (query, key, value)), strict=True)
    outs = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True)
        for q, k, v in parts
    ]
    return torch.cat(outs, dim=2)


def vlrl_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query ``[B, H, Lq, D]``, key / value ``[B, H_kv, Lk, D]``, mask ``[B, 1, Lq, Lk]`` bool or None
    -> (``[B, Lq, H, D]``, None), as transformers' attention functions return."""
    n_rep = query.shape[1] // key.shape[1]
    lengths = kwargs.get(SEGMENTS)
    if (
        query.shape[2] == 1
        and n_rep > 1
        and lengths is None
        and (attention_mask is None or attention_mask.shape[1] == 1)
    ):
        return grouped_decode(query, key, value, attention_mask, dropout, scaling), None
    key, value = repeat_heads(key, n_rep), repeat_heads(value, n_rep)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # Packed rows (vlrl.train.packing): the decoder's causal self-attention over exactly the packed tokens
    # (any mask here is transformers' plain causal one: the packed forward gives no 2-D mask). The vision
    # tower gets the same kwargs but attends per image with is_causal=False.
    if lengths is not None and is_causal and query.shape[0] == 1 and query.shape[2] == key.shape[2] == sum(lengths):
        return varlen_sdpa(query, key, value, lengths, scaling, dropout).transpose(1, 2).contiguous(), None
    # As transformers' sdpa: the causal flag (flash / cuDNN kernels) only without a mask and past decode.
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal
    )
    return out.transpose(1, 2).contiguous(), None


def grouped_decode(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, dropout: float, scaling
) -> torch.Tensor:
    """One query per sequence (a decode step): query ``[B, H, 1, D]``, key / value ``[B, H_kv, L, D]``, mask
    ``[B, 1, 1, L]`` or None -> ``[B, 1, H, D]``. The query heads that share a kv head become that head's query
    rows ``[B, H_kv, H / H_kv, D]``, so SDPA reads the keys / values as they are: repeating them wrote and read
    ``H / H_kv`` copies of every cached column at every step (6 on the 2b model: 12 query heads over 2), the
    largest memory traffic of a decode step at 256 rows. The same attention per head; no zero-stride view (the mask
    is expanded in memory)."""
    b, h, _, d = query.shape
    n_rep = h // key.shape[1]
    grouped = query.reshape(b, key.shape[1], n_rep, d)
    if mask is not None:
        mask = mask.expand(-1, -1, n_rep, -1).contiguous()
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous()


AttentionInterface.register(ATTENTION, vlrl_sdpa_forward)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the same boolean masks transformers builds for sdpa


def vision_varlen_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Bidirectional attention within each segment: query / key / value ``[1, H, S, D]``, ``cu_seq_lens_q``
    ``[n + 1]`` the segments' boundaries -> (``[1, S, H, D]``, None). One SDPA call per run of consecutive
    equal-length segments (every image of one size, or every full window), batched as ``[n, H, L, D]``."""
    if cu_seq_lens_q is None:
        # transformers' per-image loop (a version that routes "flash" names elsewhere) passes one image per call.
        # A packed call under boundary names this function does not know would attend across images: refuse it.
        unknown = sorted(k for k in kwargs if k.startswith(("cu_seq", "max_length", "max_seqlen")))
        if unknown:
            raise TypeError(f"vision attention got packed images with {unknown}, not cu_seq_lens_q: unsupported")
        return vlrl_sdpa_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    if attention_mask is not None or query.shape[0] != 1:
        raise ValueError("vision attention over packed images takes one sequence [1, H, S, D] and no mask")
    lengths = segment_lengths(cu_seq_lens_q)
    out = torch.empty_like(query)
    start = 0
    for length, run in itertools.groupby(lengths):
        n = len(list(run))
        span = slice(start, start + n * length)
        q, k, v = (x[0, :, span].unflatten(1, (n, length)).transpose(0, 1) for x in (query, key, value))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)
        out[0, :, span] = o.transpose(0, 1).flatten(1, 2)
        start += n * length
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(VISION, vision_varlen_forward)


LENGTHS_ATTR = "_vlrl_segment_lengths"
"""Where :func:`segment_lengths` keeps a boundaries tensor's lengths (with the tensor's version)."""


def segment_lengths(cu_seq_lens: torch.Tensor) -> list[int]:
    """The segments' lengths of ``cu_seq_lens`` ``[n + 1]``, read to the host once per tensor: a vision tower
    hands every block the same boundaries tensor (one for whole images, one for windows), and each read of a CUDA
    tensor is a host sync (32 a forward on the 2b model's tower). Kept on the tensor while it is unchanged."""
    seen = getattr(cu_seq_lens, LENGTHS_ATTR, None)
    if seen is not None and seen[0] == cu_seq_lens._version:
        return list(seen[1])
    lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).tolist()
    setattr(cu_seq_lens, LENGTHS_ATTR, (cu_seq_lens._version, tuple(lengths)))
    return lengths
