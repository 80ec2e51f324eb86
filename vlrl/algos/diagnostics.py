"""Learning diagnostics of one RL step: how much signal the advantages carry, where the gradient goes.

Pure functions over tensors (no model, no config), logged by the trainer into ``metrics.jsonl``:

- ``advantage_stats``: mean |A| and mean A over response tokens, the fraction of groups whose
  advantages are all zero (no gradient from them) and of groups whose returns are all equal (no
  signal for a group baseline, whatever the estimator does with them).
- ``grad_norms_by_group``: the L2 norm of the gradient of each parameter group (e.g. vision tower,
  projector, language layers, embedding), before clipping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from vlrl.algos.advantages import GroupIds, group_index
from vlrl.algos.masked import masked_mean

ZERO = 1e-12
"""|A| at or below this counts as zero (the estimators give exact zeros; this only absorbs rounding)."""


def advantage_stats(advantages: Tensor, mask: Tensor, returns: Tensor, group_ids: GroupIds) -> dict[str, float]:
    """Signal carried by one step's advantages.

    advantages ``[B, T]``, mask ``[B, T]`` (1 on trained tokens), returns ``[B]`` (episode returns),
    group_ids ``[B]`` (tensor or sequence; trajectories of one prompt share an id).

    - ``adv_abs_mean``, ``adv_mean``: over unmasked tokens.
    - ``adv_zero_group_frac``: groups in which every unmasked token has |A| <= ``ZERO``.
    - ``reward_equal_group_frac``: groups whose members all have the same return.
    - ``reward_group_std``: the mean over groups of the (population) std of returns within a group.
    """
    m = mask.bool()
    index, n_groups = group_index(group_ids, advantages.shape[0], advantages.device)
    row_max = torch.where(m, advantages.abs(), torch.zeros_like(advantages)).amax(dim=-1)  # [B]
    group_max = torch.zeros(n_groups, dtype=row_max.dtype, device=row_max.device).scatter_reduce(
        0, index, row_max, reduce="amax"
    )
    r = returns.to(torch.float64)
    lo = torch.full((n_groups,), float("inf"), dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amin")
    hi = torch.full((n_groups,), float("-inf"), dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amax")
    counts = torch.bincount(index, minlength=n_groups).to(r.dtype)
    mean = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, index, r) / counts
    var = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, index, (r - mean[index]) ** 2) / counts
    return {
        "adv_abs_mean": float(masked_mean(advantages.abs(), m)),
        "adv_mean": float(masked_mean(advantages, m)),
        "adv_zero_group_frac": float((group_max <= ZERO).to(r.dtype).mean()),
        "reward_equal_group_frac": float((hi - lo <= ZERO).to(r.dtype).mean()),
        "reward_group_std": float(var.sqrt().mean()),
    }


def grad_norms_by_group(named_params: Iterable[tuple[str, Tensor]], group_of: Callable[[str], str]) -> dict[str, float]:
    """``{group: ||grad||_2}`` over the parameters that have a gradient, grouped by ``group_of(name)``.

    Parameters without ``.grad`` are left out (a group with none does not appear); a tied weight
    listed once by ``named_parameters`` counts once. Sharded gradients (FSDP2's DTensors): the norm of this
    rank's shards (``vlrl.train.distributed.reduce_metrics`` adds the ranks' squares). One host sync in all,
    not one per parameter (on a DTensor each ``float()`` was a DTensor dispatch and a host sync), and one
    multi-tensor norm kernel per group instead of a float64 copy and a reduction per parameter (on the H100,
    2b model: 101 ms of device time a step that way; benchmarks/results/fsdp_h100/69df103)."""
    by_group: dict[str, list[Tensor]] = {}
    for name, p in named_params:
        if p.grad is not None:
            g = p.grad.detach()
            local = g.to_local() if hasattr(g, "to_local") else g
            by_group.setdefault(group_of(name), []).append(local)
    if not by_group:
        return {}
    names = list(by_group)
    norms = [torch.stack(torch._foreach_norm(by_group[n], 2, dtype=torch.float32)) for n in names]
    squares = torch.stack([v.double().square().sum() for v in norms]).tolist()
    return {n: v**0.5 for n, v in zip(names, squares, strict=True)}
