"""`AlgoConfig`: every knob of the RL algorithm in one frozen dataclass.

Help text lives once, as the attribute docstring under each field (the convention tyro and
cleanrl read). ``__post_init__`` checks names against the registries and ranges, so a typo in
a recipe fails when the config is built, not halfway through a run.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass

from vlrl.algos.advantages import ADVANTAGES
from vlrl.algos.aggregation import AGGREGATIONS
from vlrl.algos.correction import CORRECTION_LEVELS, CORRECTION_MODES
from vlrl.algos.kl import KL_ESTIMATORS
from vlrl.algos.policy_losses import POLICY_LOSSES


@dataclass(frozen=True)
class AlgoConfig:
    """Knobs of advantage estimation, policy loss, aggregation, KL and rollout correction."""

    # ---- advantages
    advantage: str = "grpo"
    """Advantage estimator: a name in ``ADVANTAGES`` (grpo, rloo, reinforce_pp)."""
    adv_norm_std: bool = True
    """grpo only: divide by the group's (unbiased) reward std; False gives Dr. GRPO's mean-only baseline."""
    adv_eps: float = 1e-6
    """Added to the std before dividing (grpo, reinforce_pp); > 0, so a zero-variance group gives 0."""
    gamma: float = 1.0
    """reinforce_pp only: per-response-token discount of the return-to-go (1.0 = undiscounted)."""

    # ---- policy loss
    policy_loss: str = "ppo_clip"
    """Policy loss: a name in ``POLICY_LOSSES`` (ppo_clip, gspo, cispo)."""
    eps_clip_low: float = 0.2
    """ppo_clip/gspo: the ratio is clipped below at ``1 - eps_clip_low`` (GSPO's paper uses 3e-4)."""
    eps_clip_high: float = 0.2
    """ppo_clip/gspo: the ratio is clipped above at ``1 + eps_clip_high`` (DAPO's clip-higher uses 0.28)."""
    clip_ratio_c: float | None = 3.0
    """ppo_clip dual clip: for negative advantages the loss is capped at ``-A * clip_ratio_c``; None turns it off."""
    cispo_eps_low: float = 1.0
    """cispo: the IS weight is clamped below at ``1 - cispo_eps_low`` (1.0 = no lower clamp)."""
    cispo_eps_high: float = 4.0
    """cispo: the IS weight is clamped above at ``1 + cispo_eps_high``."""
    log_ratio_clamp: float = 20.0
    """Every log-ratio (policy, KL, correction) is clamped to ``[-c, c]`` before ``exp``."""

    # ---- aggregation
    loss_agg: str = "token_mean"
    """Aggregation of per-token losses: token_mean, seq_mean_token_mean, seq_mean_token_sum_norm."""
    loss_norm_len: int | None = None
    """seq_mean_token_sum_norm only: the fixed divisor per sequence, normally the max response length of the run."""

    # ---- KL to a frozen reference
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3 (see ``vlrl.algos.kl``)."""
    kl_coef: float = 0.0
    """KL coefficient; 0.0 means no reference model is needed."""
    kl_in_reward: bool = False
    """True: subtract ``kl_coef * KL`` from the per-token reward; False: add it as a loss term."""

    # ---- rollout-mismatch correction (trainer old logprobs vs engine logprobs)
    correction_level: str | None = None
    """None (off), ``token`` or ``sequence``: the unit an importance weight is computed for."""
    correction_mode: str = "truncate"
    """``truncate``: cap weights at ``correction_cap``; ``mask``: zero units outside [low, high]."""
    correction_cap: float = 2.0
    """truncate mode: the largest weight kept (TIS's C)."""
    correction_low: float = 0.5
    """mask mode: units with weight below this are zeroed."""
    correction_high: float = 2.0
    """mask mode: units with weight above this are zeroed."""

    def __post_init__(self) -> None:
        for registry, name in (
            (ADVANTAGES, self.advantage),
            (POLICY_LOSSES, self.policy_loss),
            (AGGREGATIONS, self.loss_agg),
            (KL_ESTIMATORS, self.kl_estimator),
            (CORRECTION_MODES, self.correction_mode),
        ):
            registry.get(name)  # raises UnknownNameError listing valid names
        if self.correction_level is not None:
            CORRECTION_LEVELS.get(self.correction_level)
        _check(self.eps_clip_low >= 0 and self.eps_clip_high >= 0, "eps_clip_low/high must be >= 0")
        _check(self.eps_clip_low < 1, "eps_clip_low must be < 1 (the lower bound 1 - eps must stay positive)")
        _check(self.clip_ratio_c is None or self.clip_ratio_c > 1, "clip_ratio_c must be > 1 or None")
        _check(self.cispo_eps_low >= 0 and self.cispo_eps_high >= 0, "cispo_eps_low/high must be >= 0")
        _check(self.adv_eps > 0 and 0 <= self.gamma <= 1, "adv_eps must be > 0 and gamma in [0, 1]")
        _check(self.log_ratio_clamp > 0, "log_ratio_clamp must be > 0")
        _check(self.kl_coef >= 0, "kl_coef must be >= 0")
        _check(self.correction_cap > 0, "correction_cap must be > 0")
        _check(0 <= self.correction_low <= self.correction_high, "need 0 <= correction_low <= correction_high")
        _check(self.loss_norm_len is None or self.loss_norm_len > 0, "loss_norm_len must be > 0 or None")
        if self.loss_agg == "seq_mean_token_sum_norm":
            _check(
                self.loss_norm_len is not None and self.loss_norm_len > 0,
                "seq_mean_token_sum_norm needs loss_norm_len > 0 (the run's max response length)",
            )

    def replace(self, **changes: object) -> AlgoConfig:
        """A copy with ``changes`` applied (and validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"AlgoConfig: {message}")


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: help}`` read from the attribute docstrings under each field of a dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, following in zip(body, body[1:]):
        is_doc = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and is_doc:
            docs[stmt.target.id] = inspect.cleandoc(following.value.value)  # type: ignore[attr-defined]
    return docs
