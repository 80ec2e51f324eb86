"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for a Qwen-VL policy, and its full state for the engine.

**Groups.** Consecutive decoder layers, and consecutive vision blocks, form FSDP groups of
about ``GROUP_FRACTION`` of the model's parameters (at least one block; one all-gather before a group's first
forward, one reduce-scatter after its backward, freed in between); the rest — token embedding, LM head,
final norm, patch embedding, projector — is the root group, on ``model.model``. Why not a group per block:
FSDP2's hooks cost host time per group on every forward and backward, and a 2b policy's step is bound by
host time (kernel launches). On the H100, at the maze2d recipe's step (64 trajectories, micro-batch 4), the
one-rank FSDP step took 7.7 s with a group per block (60) and 5.6 s with 14 groups; the plain trainer 6.2-6.4 s
(benchmarks/results/fsdp_h100). A group of 1/16 of the model costs 1/16 of it in bf16 per rank while whole,
which ``gathered`` holds anyway for a whole pass.

**Why the root is ``model.model`` with the LM head inside it.** The chunked forward (``vlrl.train.forward``)
calls ``model.model(...)`` for hidden states and then reads ``lm_head.weight`` itself, chunk by chunk, in fp32
(``vlrl.engines.sampling.fp32_logits``): the LM head's own forward never runs, so no FSDP hook of its own
would ever all-gather it. In the root group it is all-gathered by ``model.model``'s forward and — FSDP2
keeps a root's parameters unsharded after forward, since the backward needs them at once — still whole when
the chunks read it; the gradients the chunks put on it are reduce-scattered with the root's at the end of the
backward. A tied head (the tiny models) *is* the embedding's parameter; an untied one (the 2b model) is put
in the group by registering the head under ``model.model`` while ``fully_shard`` runs.

**Precision.** With ``model.dtype=bfloat16`` and ``optim.master_weights=float32`` (the default) the sharded
parameters are fp32 — the optimizer's master weights — and forwards and backwards run in bf16
(``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: gradients are reduced in fp32); the engine is
sent the weights cast to bf16, the values the trainer's bf16 forward computes with. With
``master_weights=model`` the shards are bf16 themselves. fp32 runs (the CPU / gloo tests) cast nothing.
On one rank nothing is reduced, and the reduce dtype only decides what the micro-batches' gradients are summed in:
there it is the compute dtype, as the plain trainer sums them (autograd, in its bf16 parameters' gradients), so
the one-rank FSDP2 step is the plain step (tests/train/test_fsdp_one_rank.py). fp32 there made FSDP2 cast every
micro-batch's gradients and add them, one kernel per parameter: most of its extra update time on the CPU
(benchmarks/results/fsdp_cpu_tiny, 1.19x the plain step against 1.05x).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from vlrl.train.distributed import Dist, device_mesh

HEAD_ALIAS = "_vlrl_lm_head"
"""Name under which the LM head sits inside ``model.model`` while the root group is formed (then removed)."""


GROUP_FRACTION = 1 / 16
"""Most of the model's parameters one FSDP group of blocks holds (module docstring)."""


def towers(model: torch.nn.Module) -> list[list[torch.nn.Module]]:
    """The repeated blocks, by tower: decoder layers, then vision blocks (when the model has a vision tower)."""
    inner: Any = model.model  # a Qwen-VL ...ForConditionalGeneration's inner model
    visual = getattr(inner, "visual", None)
    return [list(inner.language_model.layers)] + ([list(visual.blocks)] if visual is not None else [])


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every repeated block: decoder layers, then vision blocks."""
    return [block for tower in towers(model) for block in tower]


def block_groups(model: torch.nn.Module, fraction: float = GROUP_FRACTION) -> list[list[torch.nn.Module]]:
    """Each tower's blocks in consecutive runs of about ``fraction`` of the model's parameters each (as many
    runs as that takes, of equal numbers of blocks; a block per run with ``fraction=0``): the FSDP groups
    besides the root."""
    budget = fraction * sum(p.numel() for p in model.parameters())
    groups: list[list[torch.nn.Module]] = []
    for tower in towers(model):
        size = sum(p.numel() for block in tower for p in block.parameters())
        n = len(tower) if budget <= 0 else min(len(tower), max(1, math.ceil(size / budget)))
        bounds = [round(i * len(tower) / n) for i in range(n + 1)]
        groups += [tower[a:b] for a, b in itertools.pairwise(bounds)]
    return groups


def default_reduce_dtype(d: Dist, compute_dtype: torch.dtype) -> torch.dtype:
    """What gradients are reduced and summed over micro-batches in: fp32 on two ranks or more; on one, which reduces
    nothing, the compute dtype, as the plain trainer sums them (module docstring, "Precision")."""
    return compute_dtype if d.world == 1 else torch.float32


def shard_model(
    model: torch.nn.Module,
    d: Dist,
    compute_dtype: torch.dtype,
    fraction: float = GROUP_FRACTION,
    reduce_dtype: torch.dtype | None = None,
) -> torch.nn.Module:
    """``fully_shard`` ``model`` in place over all ranks (see the module docstring); returns it.

    The model is on ``d.device`` in its storage dtype (fp32 masters, or bf16 with ``master_weights=model``);
    ``compute_dtype`` is what forwards run in; ``fraction``: the most of the model one group of blocks holds.
    ``reduce_dtype``: what gradients are reduced and accumulated across micro-batches in; by default fp32 on two
    ranks or more and ``compute_dtype`` on one (:func:`default_reduce_dtype`).
    """
    mesh = device_mesh(d)
    param_dtype = None if compute_dtype == torch.float32 else compute_dtype
    reduce_dtype = reduce_dtype or default_reduce_dtype(d, compute_dtype)
    # Only the root casts its inputs (the fp32 pixels, as a plain bf16 model's forward does): a block's inputs
    # are what the model hands it, as in a plain bf16 model — the vision blocks' RoPE cos/sin stay fp32.
    root_mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    block_mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    for group in block_groups(model, fraction):
        fully_shard(group, mesh=mesh, mp_policy=block_mp)
    inner: Any = model.model
    inner.add_module(HEAD_ALIAS, model.lm_head)
    try:
        fully_shard(inner, mesh=mesh, mp_policy=root_mp)
    finally:
        del inner._modules[HEAD_ALIAS]  # the head stays model.lm_head; state-dict names unchanged
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # The trainer divides each rank's loss by the global count: the gradients must be summed.
            module.set_gradient_divide_factor(1.0)
            if hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
            if hasattr(module, "set_reduce_scatter_unused_params"):  # torch >= 2.12
                # A parameter without a gradient on one rank (an untied head in a micro-batch whose tokens it
                # never scored) still takes part in the reduce-scatter, with zeros.
                module.set_reduce_scatter_unused_params(True, recurse=False)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return any(isinstance(m, FSDPModule) for m in model.modules())


def sync_gradients(model: torch.nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters its gradients (FSDP2's ``set_requires_gradient_sync``): off
    for every micro-batch of an optimizer step but the last, which reduces the sum once. A no-op when plain."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(sync, recurse=False)


@contextlib.contextmanager
def gathered(model: torch.nn.Module, backward: bool = False) -> Iterator[None]:
    """One pass over several micro-batches (a no-grad logprob pass, or with ``backward`` the forwards and
    backwards of one optimizer step): each block is gathered once, at its first forward, and stays whole
    until the pass ends, instead of being gathered again before every forward and backward (a whole
    compute-dtype copy of the model per rank while the pass runs: ZeRO-2's memory, not ZeRO-3's). The root
    group stays whole through a forward as FSDP2 runs a root (the chunked LM head relies on it); with
    ``backward`` it stays whole through the backwards too, instead of being resharded after every
    micro-batch's backward and gathered again by the next forward (a quarter of the 2b model: embedding and
    LM head). A no-op when plain."""
    if not is_sharded(model):
        yield
        return
    sharded = [b for b in blocks(model) if isinstance(b, FSDPModule)]
    root: Any = model.model
    for block in sharded:
        block.set_reshard_after_forward(False, recurse=False)
        if backward:
            block.set_reshard_after_backward(False, recurse=False)
    if backward:
        root.set_reshard_after_backward(False, recurse=False)
    try:
        yield
    finally:
        for block in sharded:
            block.set_reshard_after_forward(True, recurse=False)
            block.set_reshard_after_backward(True, recurse=False)
        root.set_reshard_after_backward(True, recurse=False)
        reshard(model)


def reshard(model: torch.nn.Module) -> None:
    """Back to sharded parameters: after a forward without backward the root group stays unsharded (its
    whole, possibly bf16, parameters registered on the modules), which a state dict must not read."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def full_weights(model: torch.nn.Module, d: Dist, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """``{name: full tensor in dtype}`` of every parameter (``named_parameters`` names), on rank 0; None elsewhere.

    ``dtype`` is the compute dtype — what FSDP's forward computes with (bf16 under mixed precision) — which is
    what the engine must serve. A plain model gives its own parameters (no copy when already in ``dtype``).

    Collective under FSDP with more than one rank (every rank must call it): one group at a time is
    all-gathered (``unshard``: one collective per group, not one per parameter), copied on rank 0's device and
    resharded, so no rank but rank 0 ever holds more than one group whole beside its shards; rank 0 ends with the
    full weights on its device, as on one rank and as the engine wants them (the embedded engine and vLLM's CUDA
    IPC route read device tensors). A copy to the CPU here instead cost the 2b model 2.87 s a step on two H200s
    (pageable copies, one per parameter) against 0.04 s on one rank (benchmarks/results/fsdp_h200x2).

    On one rank a shard *is* the whole parameter: it is cast to ``dtype`` directly — FSDP's all-gather would copy
    it twice to reach the same values (measured on the H100, 2b model: 0.068 s that way, see
    benchmarks/results/fsdp_h100).
    """
    names = [n for n, _ in model.named_parameters()]  # a tied weight once, as the engine's update expects
    params = dict(model.named_parameters())
    if not is_sharded(model):
        return {n: params[n].detach().to(dtype) for n in names}
    reshard(model)
    if d.world == 1:
        return {n: _local(params[n]).detach().to(dtype, copy=True) for n in names}
    groups = {prefix: m for prefix, m in model.named_modules() if isinstance(m, FSDPModule)}
    owned: dict[str, list[str]] = {prefix: [] for prefix in groups}
    root = next(prefix for prefix, m in groups.items() if m is model.model)
    for name in names:  # the deepest group whose module holds it; the rest (an untied LM head) is the root's
        holders = [p for p in groups if p and name.startswith(p + ".")]
        owned[max(holders, key=len) if holders else root].append(name)
    found: dict[str, torch.Tensor] = {}
    for prefix, group in groups.items():
        if not owned[prefix]:  # none, or taken with an earlier module of the same (grouped) FSDP group
            continue
        group.unshard()  # this FSDP group's parameters are registered whole until reshard
        # a grouped fully_shard([a, b, ...]) unshards all its modules at once: take theirs too
        with_it = [p for p, names in owned.items() if names and not isinstance(model.get_parameter(names[0]), DTensor)]
        for name in [n for p in with_it for n in owned[p]]:
            whole = model.get_parameter(name)
            if isinstance(whole, DTensor):
                raise RuntimeError(f"full_weights: {name} is not in FSDP group {prefix!r}")
            if d.is_main:  # a copy: reshard frees the gathered storage
                found[name] = whole.detach().to(dtype=dtype, copy=True)
        for p in with_it:
            owned[p] = []
        group.reshard()
    return {n: found[n] for n in names} if d.is_main else None


def _local(p: torch.Tensor) -> torch.Tensor:
    """A one-rank shard's whole tensor (FSDP2 pads nothing when one rank holds every row)."""
    local = p.to_local() if isinstance(p, DTensor) else p
    if local.shape != p.shape:
        raise RuntimeError(f"full_weights: a one-rank shard of shape {tuple(local.shape)} for {tuple(p.shape)}")
    return local
