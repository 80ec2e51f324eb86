"""The policy forward: exactly the batch's tokens and vision tensors → per-token logprobs and entropy.

Logprobs follow the engine logprob contract (``vlrl.engines.types``): ``log_softmax(logits / T)``
over the vocabulary without the vision ids, in fp32, ``T`` the batch's rollout temperature (1 for greedy), before any
truncation. Positions are explicit mRoPE ids from ``image_grid_thw``, computed by the same function
the engine uses (``vlrl.models.positions.mrope_positions``).

**Memory.** The vocabulary is 151,936 rows, so ``[B, L, V]`` fp32 logits are ``B·L·0.6 MB``
(B=8, L=2048: 10 GB, and autograd keeps about twice that for the backward). Here the decoder runs
once to hidden states ``[B, L, H]``; only the positions that are trained on (``loss_mask == 1``)
are gathered, ``[N, H]``, and projected to the vocabulary ``chunk_size`` rows at a time. One chunk
holds its fp32 logits, their log-softmax and the softmax for the entropy: about ``3·C·V·4`` bytes
(C=512: ~0.9 GB), independent of B and L. With gradients each chunk runs under activation
checkpointing, so only its ``[C, H]`` input and ``[C]`` outputs are kept for the backward, which
recomputes the chunk (one chunk alive at a time again). The cost is one extra ``[C, H] × [H, V]``
matmul per chunk in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from vlrl.engines.sampling import contract_logprobs, effective_temperature, fp32_logits
from vlrl.models.positions import mrope_positions
from vlrl.models.tokenizer import vision_token_ids
from vlrl.train.batch import Batch
from vlrl.train.packing import packed_hidden_states

DEFAULT_CHUNK = 512


@dataclass(frozen=True)
class ProbeOutput:
    """The trainer's distribution at ``batch.engine_topk`` positions (``[P, k]`` each, fp32 / long).

    topk_ids, topk_logprobs: the trainer's own k most likely ids and contract logprobs.
    at_engine_ids:           the trainer's contract logprobs of the engine's top-k ids.
    """

    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    at_engine_ids: torch.Tensor


@dataclass(frozen=True)
class ForwardOutput:
    """logprobs, entropy ``[B, L]`` fp32, aligned with ``input_ids`` (0 where not computed);
    ``computed`` ``[B, L]`` bool marks the positions that were; ``probe`` is set when requested."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    computed: torch.Tensor
    probe: ProbeOutput | None = None


def policy_forward(
    model,
    batch: Batch,
    *,
    chunk_size: int | None = DEFAULT_CHUNK,
    positions: Literal["loss_mask", "all"] = "loss_mask",
    with_entropy: bool = True,
    entropy_grad: bool = False,
    probe: bool = False,
    packing: bool = False,
) -> ForwardOutput:
    """Per-token contract logprobs (and entropy) of ``batch`` under ``model``.

    Works with gradients (training) and under ``torch.no_grad()`` (old / reference logprobs).
    ``positions="loss_mask"`` computes only generated tokens; ``"all"`` every real token after the
    first. ``chunk_size=None`` projects all positions at once (the unchunked reference).
    ``probe=True`` also returns the trainer's top-k at ``batch.engine_topk`` (no gradient).
    Entropy is a detached metric unless ``entropy_grad=True`` (an entropy bonus in the loss).
    ``packing=True`` runs the decoder on the rows packed into one unpadded sequence
    (``vlrl.train.packing``); the outputs are the same ``[B, L]`` rows.
    """
    device = next(model.parameters()).device
    hidden = packed_hidden_states(model, batch) if packing else decoder_hidden_states(model, batch)  # [B, L, H]
    ids = batch.input_ids.to(device)
    B, L = ids.shape
    want = batch.loss_mask.to(device).bool() if positions == "loss_mask" else batch.attention_mask.to(device).bool()
    want = want.clone()
    want[:, 0] = False  # nothing predicts the first token
    rows, cols = want.nonzero(as_tuple=True)
    T = effective_temperature(batch.temperature)
    lp, ent = chunked_token_stats(
        model.get_output_embeddings(),
        hidden[rows, cols - 1],
        ids[rows, cols],
        T,
        banned=banned_ids(model),
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        entropy_grad=entropy_grad,
    )
    logprobs = torch.zeros((B, L), dtype=torch.float32, device=device).index_put((rows, cols), lp)
    entropy = torch.zeros((B, L), dtype=torch.float32, device=device).index_put((rows, cols), ent)
    out_probe = _probe(model, batch, hidden, T, chunk_size) if probe else None
    return ForwardOutput(logprobs=logprobs, entropy=entropy, computed=want, probe=out_probe)


def banned_ids(model) -> torch.Tensor:
    """``[5]`` long: the vision placeholder ids the logprob contract leaves out."""
    return torch.tensor(vision_token_ids(model.config), dtype=torch.long)


def decoder_hidden_states(model, batch: Batch) -> torch.Tensor:
    """``[B, L, H]`` last hidden states of the decoder over the batch (model dtype), with its images."""
    device = next(model.parameters()).device
    ids, attn = batch.input_ids.to(device), batch.attention_mask.to(device)
    grid = None if batch.image_grid_thw is None else batch.image_grid_thw.to(device)
    pixels = None if batch.pixel_values is None else batch.pixel_values.to(device, model.dtype)
    pos = mrope_positions(model, ids, attn, grid)  # [3, B, L], the engine's own position code
    out = model.model(
        input_ids=ids, attention_mask=attn, position_ids=pos, pixel_values=pixels, image_grid_thw=grid, use_cache=False
    )
    return out.last_hidden_state


def chunked_token_stats(
    lm_head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    *,
    banned: torch.Tensor,
    chunk_size: int | None = DEFAULT_CHUNK,
    with_entropy: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract logprobs of ``targets`` ``[N]`` and entropies from ``hidden`` ``[N, H]``, both ``[N]`` fp32.

    ``banned`` ``[n]``: ids outside the contract's softmax (the vision placeholders; see
    ``vlrl.engines.types``).

    ``chunk_size`` rows are projected at a time (None: all at once). Under autograd each chunk is
    checkpointed so its ``[C, V]`` tensors are not kept for the backward.

    ``entropy_grad=False`` computes the entropy from detached logprobs. Besides saving work, this
    matters for memory: a checkpointed chunk frees its recomputed tensors only as the backward
    uses them, so a differentiable entropy that the loss then ignores would keep two ``[C, V]``
    tensors per chunk alive to the end of the backward (measured: 6.5 GB instead of 1 GB).
    """
    n = hidden.shape[0]
    if n == 0:  # still attached to the graph, so a micro-batch of padding rows back-propagates zeros
        empty = (hidden.sum() + sum(p.sum() for p in lm_head.parameters())).float().mul(0).reshape(1)[:0]
        return empty, empty.detach()
    step = n if chunk_size is None else chunk_size
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    lps, ents = [], []
    for s in range(0, n, step):
        h, tgt = hidden[s : s + step], targets[s : s + step]
        if grad and chunk_size is not None:
            lp, ent = checkpoint(
                _chunk, lm_head, h, tgt, temperature, banned, with_entropy, entropy_grad, use_reentrant=False
            )
        else:
            lp, ent = _chunk(lm_head, h, tgt, temperature, banned, with_entropy, entropy_grad)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents)


def _chunk(
    lm_head,
    h: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    banned: torch.Tensor,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logp = contract_logprobs(fp32_logits(lm_head, h), temperature, banned)  # [C, V], the engine's own functions
    lp = logp.gather(1, targets[:, None])[:, 0]
    if not with_entropy:
        return lp, torch.zeros_like(lp).detach()
    src = logp if entropy_grad else logp.detach()
    return lp, -(src.exp() * torch.nan_to_num(src, neginf=0.0)).sum(-1)  # banned ids: 0 · -inf -> 0


@torch.no_grad()
def _probe(model, batch: Batch, hidden: torch.Tensor, temperature: float, chunk_size: int | None) -> ProbeOutput | None:
    top = batch.engine_topk
    if top is None:
        return None
    device = hidden.device
    rows, cols = top.rows.to(device), top.positions.to(device)
    h = hidden[rows, cols - 1].detach()
    eng_ids = top.ids.to(device)
    step = len(top) if chunk_size is None else chunk_size
    ids, lps, at = [], [], []
    for s in range(0, len(top), step):
        logp = contract_logprobs(
            fp32_logits(model.get_output_embeddings(), h[s : s + step]), temperature, banned_ids(model)
        )
        v, i = torch.topk(logp, top.k, dim=-1)
        ids.append(i)
        lps.append(v)
        at.append(logp.gather(1, eng_ids[s : s + step]))
    return ProbeOutput(topk_ids=torch.cat(ids), topk_logprobs=torch.cat(lps), at_engine_ids=torch.cat(at))
