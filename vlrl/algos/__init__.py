"""vlrl.algos: the RL algorithm library, as registered pure functions over torch tensors.

Imports torch, the standard library and ``vlrl.registry`` (the one ``Registry``: duplicate names raise,
unknown names list valid ones) only. Modules:

- ``advantages``: grpo, rloo, reinforce_pp — rewards ``[B]``/``[B, T]`` → advantages ``[B, T]``
- ``policy_losses``: ppo_clip (+ dual clip), gspo, cispo — per-token losses ``[B, T]`` + metrics
- ``aggregation``: token_mean, seq_mean_token_mean, seq_mean_token_sum_norm — ``[B, T]`` → scalar
- ``kl``: k1, k2, k3 estimators; ``kl_loss`` (loss term) and ``kl_penalized_rewards`` (in reward)
- ``correction``: rollout-mismatch importance weights (token/sequence × truncate/mask)
- ``config``: ``AlgoConfig``, the frozen dataclass of every knob

One update step, in order (``logp`` with grad; ``old``, ``rollout``, ``ref`` constants; all ``[B, T]``)::

    if cfg.kl_in_reward:
        rewards = kl_penalized_rewards(rewards, old, ref, mask, cfg)           # [B] -> [B, T]
    adv = get_advantage_fn(cfg.advantage)(rewards, mask, uids, cfg)              # [B, T]
    weights, corr_metrics = rollout_correction(old, rollout, mask, cfg)          # [B, T]
    loss, metrics = get_policy_loss_fn(cfg.policy_loss)(logp, old, adv, mask, cfg)
    loss = loss * weights
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        loss = loss + kl_loss(logp, ref, mask, cfg)
    n_tok, n_seq = agg_counts(micro_batch_masks)                                 # whole optimizer step
    get_aggregation_fn(cfg.loss_agg)(loss, mask, num_tokens=n_tok, num_seqs=n_seq,
                                     norm_len=cfg.loss_norm_len).backward()
"""

from vlrl.algos.advantages import ADVANTAGES, get_advantage_fn, register_advantage, token_rewards
from vlrl.algos.aggregation import AGGREGATIONS, agg_counts, get_aggregation_fn, register_aggregation
from vlrl.algos.config import AlgoConfig
from vlrl.algos.correction import CORRECTION_LEVELS, CORRECTION_MODES, rollout_correction
from vlrl.algos.kl import KL_ESTIMATORS, get_kl_fn, kl_loss, kl_penalized_rewards, register_kl
from vlrl.algos.policy_losses import POLICY_LOSSES, get_policy_loss_fn, register_policy_loss

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "CORRECTION_LEVELS",
    "CORRECTION_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AlgoConfig",
    "agg_counts",
    "get_advantage_fn",
    "get_aggregation_fn",
    "get_kl_fn",
    "get_policy_loss_fn",
    "kl_loss",
    "kl_penalized_rewards",
    "register_advantage",
    "register_aggregation",
    "register_kl",
    "register_policy_loss",
    "rollout_correction",
    "token_rewards",
]
