"""Learning diagnostics of one RL step: how much signal the advantages carry (where the gradient goes, by
module group: ``vlrl.train.trainer.clip_gradients``).

Pure functions over tensors (no model, no config), logged by the trainer into ``metrics.jsonl``:

- ``advantage_stats``: mean |A| and mean A over response tokens, the fraction of groups whose
  advantages are all zero (no gradient from them) and of groups whose returns are all equal (no
  signal for a group baseline, whatever the estimator does with them).
"""

from __future__ import annotations

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
