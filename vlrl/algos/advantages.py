"""Advantage estimators: rewards of a batch of trajectories → per-token advantages.

Every estimator has the signature::

    fn(rewards, response_mask, group_ids, cfg) -> advantages

- ``rewards``: ``[B]`` one scalar per trajectory, or ``[B, T]`` per-token rewards (e.g. a KL
  penalty folded into the reward). grpo and rloo sum ``[B, T]`` rewards over the response mask
  into one score per trajectory.
- ``response_mask``: ``[B, T]`` 1 on tokens the policy generated (the trained tokens).
- ``group_ids``: ``[B]`` integer tensor or a length-``B`` sequence of hashables (e.g. prompt
  uids); trajectories that share an id form one group. Ignored by reinforce_pp.
- returns ``[B, T]`` float advantages, exactly 0 on masked tokens.

Advantages carry no gradient (rewards are data); callers need not detach them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vlrl.algos.masked import masked_mean, masked_std
from vlrl.registry import Registry

if TYPE_CHECKING:
    from vlrl.algos.config import AlgoConfig

GroupIds = Tensor | Sequence[Hashable]
AdvantageFn = Callable[[Tensor, Tensor, "GroupIds | None", "AlgoConfig"], Tensor]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
register_advantage = ADVANTAGES.register
get_advantage_fn = ADVANTAGES.get


# ---------------------------------------------------------------- helpers


def group_index(group_ids: GroupIds | None, batch_size: int, device: torch.device) -> tuple[Tensor, int]:
    """Map group ids to dense indices ``[B]`` (long, 0..G-1) and return them with ``G``.

    Tensor ids go through ``torch.unique``; other sequences are numbered in order of first
    appearance. Raises ``ValueError`` when ids are missing or their length is not ``B``.
    """
    if group_ids is None:
        raise ValueError("this advantage estimator needs group_ids (one id per trajectory)")
    if len(group_ids) != batch_size:
        raise ValueError(f"group_ids has {len(group_ids)} entries for a batch of {batch_size}")
    if isinstance(group_ids, Tensor):
        _, inverse = torch.unique(group_ids.reshape(-1), return_inverse=True)
        return inverse.to(device), int(inverse.max()) + 1 if batch_size else 0
    codes: dict[Hashable, int] = {}
    index = [codes.setdefault(g, len(codes)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(codes)


def sequence_scores(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``[B]`` float scores: ``rewards`` itself if ``[B]``, else its sum over the response mask."""
    _check_rewards(rewards, response_mask)
    r = rewards.float() if not rewards.is_floating_point() else rewards
    return r if r.dim() == 1 else (r * response_mask.to(r.dtype)).sum(-1)


def token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``[B, T]`` per-token rewards. A ``[B]`` reward is placed on each row's last response token.

    ``[B, T]`` input is returned masked. Rows without response tokens get no reward.
    """
    _check_rewards(rewards, response_mask)
    m = response_mask.bool()
    r = rewards.float() if not rewards.is_floating_point() else rewards
    if r.dim() == 2:
        return r * m.to(r.dtype)
    T = m.shape[1]
    positions = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, positions, -1).max(dim=1).values  # [B], -1 if the row is empty
    out = torch.zeros(m.shape, dtype=r.dtype, device=r.device)
    rows = (last >= 0).nonzero(as_tuple=True)[0]
    out[rows, last[rows]] = r[rows]
    return out


def _check_rewards(rewards: Tensor, response_mask: Tensor) -> None:
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got {tuple(response_mask.shape)}")
    ok = rewards.shape == response_mask.shape or tuple(rewards.shape) == (response_mask.shape[0],)
    if not ok:
        raise ValueError(
            f"rewards must be [B] or [B, T]; got {tuple(rewards.shape)} for response_mask {tuple(response_mask.shape)}"
        )


def _per_token(values: Tensor, response_mask: Tensor) -> Tensor:
    """Broadcast ``[B]`` values over ``[B, T]``, zero on masked tokens."""
    return values[:, None] * response_mask.to(values.dtype)


def _group_sums(values: Tensor, index: Tensor, n_groups: int) -> Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


# ---------------------------------------------------------------- estimators


@register_advantage("grpo")
def grpo_advantages(rewards: Tensor, response_mask: Tensor, group_ids: GroupIds | None, cfg: AlgoConfig) -> Tensor:
    """Group-relative advantage: ``A_i = (s_i - mean_g) / (std_g + eps)`` on every response token.

    ``s_i`` is trajectory i's score (see module docstring); ``mean_g`` and the unbiased
    (Bessel-corrected, as ``torch.std``) ``std_g`` are over its group. With
    ``cfg.adv_norm_std=False`` the division is skipped (``A_i = s_i - mean_g``, Dr. GRPO).
    A group of one trajectory, or of equal scores, gets advantage 0.
    Shapes: rewards ``[B]``/``[B, T]``, response_mask ``[B, T]`` → ``[B, T]``.
    """
    scores = sequence_scores(rewards, response_mask)
    index, n_groups = group_index(group_ids, scores.shape[0], scores.device)
    counts = torch.bincount(index, minlength=n_groups).to(scores.dtype)
    centered = scores - (_group_sums(scores, index, n_groups) / counts)[index]
    if cfg.adv_norm_std:
        var = _group_sums(centered**2, index, n_groups) / (counts - 1).clamp(min=1)
        centered = centered / (var.sqrt()[index] + cfg.adv_eps)
    return _per_token(centered, response_mask)


@register_advantage("rloo")
def rloo_advantages(rewards: Tensor, response_mask: Tensor, group_ids: GroupIds | None, cfg: AlgoConfig) -> Tensor:
    """REINFORCE leave-one-out: ``A_i = s_i - mean_{j in group, j != i} s_j``.

    Equals ``n/(n-1) * (s_i - mean_g)`` for a group of ``n``. No std normalisation.
    A group of one has no baseline and gets advantage 0.
    Shapes: rewards ``[B]``/``[B, T]``, response_mask ``[B, T]`` → ``[B, T]``.
    """
    scores = sequence_scores(rewards, response_mask)
    index, n_groups = group_index(group_ids, scores.shape[0], scores.device)
    n = torch.bincount(index, minlength=n_groups).to(scores.dtype)[index]
    others_mean = (_group_sums(scores, index, n_groups)[index] - scores) / (n - 1).clamp(min=1)
    adv = torch.where(n > 1, scores - others_mean, torch.zeros_like(scores))
    return _per_token(adv, response_mask)


def discounted_returns(token_reward: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """Return-to-go over response tokens: ``G_t = r_t + gamma * G_next``, ``[B, T]`` → ``[B, T]``.

    ``G_next`` is the return of the next *response* token of the row: masked tokens (prompt,
    environment observations between turns, padding) are skipped, not counted as steps, and
    get ``G = 0``. With ``gamma = 1`` every response token gets the sum of the rewards at or
    after it.
    """
    m = response_mask.bool()
    r = token_reward * m.to(token_reward.dtype)
    if gamma == 1.0:
        returns = r.flip(-1).cumsum(-1).flip(-1)
    else:
        returns = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in range(r.shape[1] - 1, -1, -1):
            running = torch.where(m[:, t], r[:, t] + gamma * running, running)
            returns[:, t] = running
    return returns * m.to(r.dtype)


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    rewards: Tensor, response_mask: Tensor, group_ids: GroupIds | None, cfg: AlgoConfig
) -> Tensor:
    """REINFORCE++: discounted token returns, whitened over all response tokens of the batch.

    1. Token rewards: a ``[B]`` reward sits on each row's last response token; ``[B, T]``
       rewards are used as given (masked).
    2. ``G = discounted_returns(token_rewards, response_mask, cfg.gamma)`` (see there).
    3. ``A = (G - mean) / (std + cfg.adv_eps)`` where mean and unbiased std run over every
       response token of the whole batch (token-weighted: a long response counts once per
       token). No critic, no group baseline; ``group_ids`` is ignored.
    Shapes: rewards ``[B]``/``[B, T]``, response_mask ``[B, T]`` → ``[B, T]``.
    """
    returns = discounted_returns(token_rewards(rewards, response_mask), response_mask, cfg.gamma)
    mean = masked_mean(returns, response_mask)
    std = masked_std(returns, response_mask)
    return (returns - mean) / (std + cfg.adv_eps) * response_mask.to(returns.dtype)
