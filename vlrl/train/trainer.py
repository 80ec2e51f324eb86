"""The trainer: policy-gradient and SFT updates on a :class:`~vlrl.train.batch.Batch`.

Callable step by step (a service can drive it): ``logprobs`` (no grad), ``rl_step`` (advantages →
epochs × mini-batches with exact gradient accumulation over micro-batches → optimizer steps) and
``sft_step`` (cross-entropy on generated tokens). The algorithm pieces are the registered pure
functions of :mod:`vlrl.algos`, chosen by name in :class:`~vlrl.algos.config.AlgoConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from vlrl.algos import get_advantage_fn, get_aggregation_fn
from vlrl.algos.config import AlgoConfig
from vlrl.algos.correction import rollout_correction
from vlrl.algos.diagnostics import advantage_stats
from vlrl.algos.kl import kl_loss, kl_penalized_rewards
from vlrl.algos.policy_losses import get_policy_loss_fn
from vlrl.train.batch import Batch
from vlrl.train.config import OptimSection
from vlrl.train.distributed import all_reduce_sum_, global_agg_counts
from vlrl.train.forward import ForwardOutput, ProbeOutput, policy_forward
from vlrl.train.fsdp import gathered, sync_gradients
from vlrl.train.master import MasterAdamW


@dataclass(frozen=True)
class StepInputs:
    """Per-token tensors of one RL step, ``[B, L]`` aligned with ``batch.input_ids``."""

    old_logprobs: torch.Tensor
    """The trainer's logprobs before the update (the PPO ratio's denominator)."""
    advantages: torch.Tensor
    weights: torch.Tensor
    """Rollout-correction importance weights (the mask when correction is off)."""
    ref_logprobs: torch.Tensor | None


PARAM_GROUPS = (("merger", "merger"), ("visual", "vision"), ("embed_tokens", "embed"), ("lm_head", "embed"))
"""``(substring of a parameter name, group)``, first match wins; anything else is ``language``. Qwen-VL
names: ``model.visual.{patch_embed,blocks}`` is the vision tower, ``model.visual.merger`` (and Qwen3's
``deepstack_merger_list``) the projector into the language model, ``embed_tokens``/``lm_head`` the
(often tied) token embedding and output head, ``language_model.{layers,norm}`` the decoder."""


def param_group(name: str) -> str:
    """The module group of a parameter name: vision, merger, embed or language (see ``PARAM_GROUPS``)."""
    return next((group for key, group in PARAM_GROUPS if key in name), "language")


def make_optimizer(
    model, lr: float, optim: OptimSection, lr_scale: Mapping[str, float] | None = None
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, one parameter group per module group (``param_group``)
    with learning rate ``lr * lr_scale.get(group, 1)``.

    Why per module: Adam moves every coordinate by about ``lr`` per step whatever the size of its
    gradient, so parameters whose gradient is mostly noise move as fast as those that carry signal.
    Measured on color_square (vlrl/recipes/color_square_rl.toml): at the RL ``lr`` the decoder needs
    (3e-3), the tied embedding / LM head rows of the four colour words chase whichever colours were
    right in each batch, and the colour prior collapses onto two colours (2 of 2 seeds with groups of
    4, 1 of 2 with groups of 8); with ``{embed = 0.1}`` every colour kept a prior of at least 0.14 (the
    four runs checked).
    """
    scale = dict(lr_scale or {})
    unknown = set(scale) - {group for _, group in PARAM_GROUPS} - {"language"}
    if unknown:
        raise ValueError(
            f"lr_scale has unknown module group(s) {sorted(unknown)}; groups: vision, merger, language, embed"
        )
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault(param_group(name), []).append(p)
    param_groups = [{"params": ps, "lr": lr * float(scale.get(g, 1.0)), "name": g} for g, ps in groups.items()]
    adamw = MasterAdamW if optim.master_weights == "float32" else torch.optim.AdamW
    fused = all(p.is_cuda for ps in groups.values() for p in ps) or None  # one kernel for all tensors on GPU
    return adamw(param_groups, lr=lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay, fused=fused)


class Trainer:
    """Owns the policy model and its optimizer; ``ref_model`` (frozen) when ``algo.kl_coef > 0``."""

    def __init__(self, model, algo: AlgoConfig, optim: OptimSection, *, ref_model=None, lr: float | None = None):
        """``lr=None``: the RL optimizer, ``optim.lr`` scaled per module by ``optim.lr_scale``; an explicit
        ``lr`` (the SFT warm start's own AdamW) trains every module at that rate."""
        self.model, self.algo, self.optim = model, algo, optim
        self.ref_model = ref_model
        scale = optim.lr_scale if lr is None else None
        self.optimizer = make_optimizer(model, optim.lr if lr is None else lr, optim, scale)
        self._warmup = optim.warmup_steps if lr is None else 0
        self._base_lrs = [group["lr"] for group in self.optimizer.param_groups]

    @torch.no_grad()
    def logprobs(self, batch: Batch, model=None, *, probe: bool = False) -> ForwardOutput:
        """Contract logprobs ``[B, L]`` of the batch's generated tokens under ``model`` (default: the
        policy), in micro-batches of ``optim.micro_batch_size`` rows.

        Micro-batches bound memory, and on CUDA they also keep the numerics the engine has: one
        forward over a 32-row, 115k-patch maze batch drifted by mean |Δ| 1e-5 (max 5e-5, random tiny
        model) where 4-row micro-batches agreed to 2e-6 (H100, fp32; measured at 5bd18d2, before the
        attention fix of vlrl.models.attention, with a probe since folded into benchmarks/gpu_correctness.py).
        ``probe=True`` adds the trainer's top-k at the engine's top-k positions (``batch.engine_topk``).
        """
        model = model or self.model
        with gathered(model):  # FSDP: each block gathered once for all micro-batches
            parts = [
                policy_forward(model, sub, with_entropy=False, probe=probe, packing=self.optim.packing)
                for sub in batch.split(self.optim.micro_batch_size)
            ]
        B, L = batch.input_ids.shape
        out = torch.zeros((B, L), dtype=torch.float32, device=parts[0].logprobs.device)
        computed = torch.zeros((B, L), dtype=torch.bool, device=out.device)
        row = 0
        for part in parts:
            b, width = part.logprobs.shape
            out[row : row + b, :width] = part.logprobs
            computed[row : row + b, :width] = part.computed
            row += b
        return ForwardOutput(logprobs=out, entropy=torch.zeros_like(out), computed=computed, probe=_cat_probes(parts))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prepare(self, batch: Batch, old: ForwardOutput, ref: torch.Tensor | None = None) -> tuple[StepInputs, dict]:
        """Advantages, correction weights and reference logprobs for one RL step. ``ref`` ``[B, L]``: the
        reference logprobs when the caller computed them already; else from ``ref_model`` when there is one."""
        batch = batch.to(self.device)
        cfg, mask = self.algo, batch.loss_mask
        if ref is None and self.ref_model is not None:
            ref = self.logprobs(batch, self.ref_model).logprobs
        rewards = batch.rewards.sum(-1)  # [B]: the episode return of each trajectory
        if cfg.kl_in_reward and ref is not None:
            rewards = kl_penalized_rewards(rewards, old.logprobs, ref, mask, cfg)
        adv = get_advantage_fn(cfg.advantage)(rewards, mask, batch.groups.tolist(), cfg)
        weights, corr = rollout_correction(old.logprobs, batch.rollout_logprobs, mask, cfg)
        return StepInputs(old.logprobs, adv, weights, ref), {f"correction/{k}": float(v) for k, v in corr.items()}

    def rl_step(self, batch: Batch, inputs: StepInputs, *, seed: int = 0) -> dict[str, float]:
        """``epochs`` passes of ``mini_batches`` optimizer steps over ``batch``; metrics averaged, plus
        the step's advantage statistics (``vlrl.algos.diagnostics.advantage_stats``)."""
        gen = torch.Generator().manual_seed(seed)
        batch = batch.to(self.device)
        stats = advantage_stats(inputs.advantages, batch.loss_mask, batch.rewards.sum(-1), batch.groups)
        log: dict[str, list[float]] = {}
        for _ in range(self.optim.epochs):
            order = torch.randperm(batch.size, generator=gen).tolist()
            size = -(-batch.size // self.optim.mini_batches)
            for start in range(0, batch.size, size):
                for k, v in self._update(batch, order[start : start + size], inputs).items():
                    log.setdefault(k, []).append(v)
        return {k: sum(v) / len(v) for k, v in log.items()} | stats

    def _update(self, batch: Batch, rows: list[int], inputs: StepInputs) -> dict[str, float]:
        """One optimizer step over ``rows``, accumulated over micro-batches (exact, see vlrl.algos.aggregation)."""
        cfg = self.algo
        micro = [rows[i : i + self.optim.micro_batch_size] for i in range(0, len(rows), self.optim.micro_batch_size)]
        subs = [batch.select(m) for m in micro]
        counts = global_agg_counts(s.loss_mask for s in subs)  # every rank's tokens (FSDP sums gradients)
        agg = get_aggregation_fn(cfg.loss_agg)
        total, metrics = 0.0, dict[str, float]()
        first_sum, first_n = 0.0, 0
        with gathered(self.model, backward=True):  # FSDP: each block gathered once for the whole step
            for i, (m, sub) in enumerate(zip(micro, subs, strict=True)):
                sync_gradients(self.model, i == len(subs) - 1)  # FSDP: reduce once, after the last micro-batch
                t = _rows(inputs, m, sub.input_ids.shape[1])
                out = policy_forward(self.model, sub, packing=self.optim.packing)
                loss_tok, pm = get_policy_loss_fn(cfg.policy_loss)(
                    out.logprobs, t.old_logprobs, t.advantages, sub.loss_mask, cfg
                )
                loss_tok = loss_tok * t.weights
                if cfg.kl_coef > 0 and not cfg.kl_in_reward and t.ref_logprobs is not None:
                    loss_tok = loss_tok + kl_loss(out.logprobs, t.ref_logprobs, sub.loss_mask, cfg)
                loss = agg(
                    loss_tok,
                    sub.loss_mask,
                    num_tokens=counts.num_tokens,
                    num_seqs=counts.num_seqs,
                    norm_len=cfg.loss_norm_len,
                )
                loss.backward()
                total += float(loss.detach())
                share = float(sub.loss_mask.sum()) / max(1, counts.num_tokens)
                pm["entropy"] = (out.entropy.detach() * sub.loss_mask).sum() / sub.loss_mask.sum().clamp(min=1)
                for k, v in pm.items():
                    metrics[k] = metrics.get(k, 0.0) + share * float(v)
                first = first_tokens(sub.loss_mask)
                first_sum += float((out.entropy.detach() * first).sum())
                first_n += int(first.sum())
            metrics["entropy_first_token"] = first_sum / max(1, first_n)
        return metrics | {"loss": total} | self._optimizer_step()

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """Cross-entropy (token mean) on the batch's generated tokens, one optimizer step."""
        batch = batch.to(self.device)
        micro = [
            list(range(i, min(i + self.optim.micro_batch_size, batch.size)))
            for i in range(0, batch.size, self.optim.micro_batch_size)
        ]
        subs = [batch.select(m) for m in micro]
        n_tok = global_agg_counts(s.loss_mask for s in subs).num_tokens
        total = 0.0
        with gathered(self.model, backward=True):
            for i, sub in enumerate(subs):
                sync_gradients(self.model, i == len(subs) - 1)
                out = policy_forward(
                    self.model, sub.replace(temperature=1.0), with_entropy=False, packing=self.optim.packing
                )
                loss = -(out.logprobs * sub.loss_mask).sum() / max(1, n_tok)
                loss.backward()
                total += float(loss.detach())
        return {"loss": total} | self._optimizer_step()

    def _optimizer_step(self) -> dict[str, float]:
        """Clip, step, zero; returns ``grad_norm`` (global, before clipping) and ``grad_norm/<group>``
        per module group (``param_group``), also before clipping."""
        with torch.profiler.record_function("vlrl.clip_grad_norm"):  # a label for profiles (benchmarks/fsdp_*.py)
            norms = clip_gradients(self.model, self.optim.grad_clip if self.optim.grad_clip > 0 else math.inf)
        warm = {}
        if self._warmup:
            factor = warmup_factor(steps_taken(self.optimizer), self._warmup)
            for group, base in zip(self.optimizer.param_groups, self._base_lrs, strict=True):
                group["lr"] = base * factor
            warm = {"lr_factor": factor}
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norms | warm


def clip_gradients(model: torch.nn.Module, max_norm: float) -> dict[str, float]:
    """Scale ``model``'s gradients to a global L2 norm of at most ``max_norm`` (``math.inf``: measure only), as
    ``torch.nn.utils.clip_grad_norm_`` does; returns ``grad_norm`` (global, before clipping) and
    ``grad_norm/<group>`` per module group (``param_group``), over every rank's shards under FSDP.

    Why not ``clip_grad_norm_``: on FSDP2's DTensor gradients each of its ops is a DTensor dispatch over ~700
    tensors, and the per-group norms were a second pass (2b model, H200, one rank: 100 ms of host time a step
    against 27 ms for the plain model's tensors; benchmarks/results/fsdp_h100/bb8455e). Here a sharded
    gradient is read as its local shard, the squares of every group are summed over ranks in one collective,
    and the host syncs once. Norms are summed in float64 (``clip_grad_norm_`` sums bf16 gradients' norms in bf16).
    The gradients are on one device; under FSDP every rank has gradients in the same module groups (FSDP2's
    reduce-scatter gives every rank a shard of every gradient), as the one collective needs.
    """
    by_group: dict[str, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():  # a tied weight once
        if p.grad is not None:
            g = p.grad.detach()
            by_group.setdefault(param_group(name), []).append(g.to_local() if isinstance(g, DTensor) else g)
    if not by_group:
        return {"grad_norm": 0.0}
    groups = list(by_group)
    squares = torch.stack(  # [G] this rank's, then every rank's
        [torch.stack(torch._foreach_norm(by_group[g], 2, dtype=torch.float32)).double().square().sum() for g in groups]
    )
    total = all_reduce_sum_(squares).sum().sqrt()
    if max_norm < math.inf:
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for grads in by_group.values():
            for g in grads:
                by_kind.setdefault((g.device, g.dtype), []).append(g)
        for (device, dtype), grads in by_kind.items():  # the factor in the gradients' dtype: one fused multiply on
            torch._foreach_mul_(grads, coef.to(device, dtype))  # CUDA (another dtype is one kernel per tensor)
    values = torch.cat([total[None], squares.sqrt()]).tolist()  # the one host sync
    return {"grad_norm": values[0]} | {f"grad_norm/{g}": v for g, v in sorted(zip(groups, values[1:]))}


def warmup_factor(taken: int, warmup_steps: int) -> float:
    """The lr factor of the optimizer step after ``taken`` steps: (taken + 1) / warmup_steps, at most 1.

    Why: a fresh AdamW's first update is about lr * sign(gradient) on every weight (its second-moment
    estimate is one gradient's square), whatever the gradient's size. Measured on color_square after a
    cut-short SFT (benchmarks/results/rl_after_sft_cpu.json): at lr 3e-3 the first fresh step loses the answer
    format (greedy 0.86 -> 0.25); a warm-up delays that fall but does not prevent it: the lr itself decides."""
    return min(1.0, (taken + 1) / warmup_steps)


def steps_taken(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer steps taken so far, read from AdamW's own per-parameter ``step`` (so a resumed optimizer
    continues its warm-up where it stopped); 0 before the first."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if "step" in state:
                return int(state["step"])
    return 0


def first_tokens(loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` float: 1 on the first generated token of every turn (a 1 in ``loss_mask`` after a 0).

    In color_square that is the colour word, the one decision of the reply; the tokens after it
    (end of turn) are near-deterministic and dilute a per-token entropy mean.
    """
    m = loss_mask.bool()
    before = torch.zeros_like(m)
    before[:, 1:] = m[:, :-1]
    return (m & ~before).to(torch.float32)


def _cat_probes(parts: list[ForwardOutput]) -> ProbeOutput | None:
    """Micro-batches are consecutive rows and ``engine_topk`` is in row order, so the probes concatenate."""
    probes = [p.probe for p in parts if p.probe is not None]
    if not probes:
        return None
    return ProbeOutput(
        *(torch.cat([getattr(p, f) for p in probes]) for f in ("topk_ids", "topk_logprobs", "at_engine_ids"))
    )


def _rows(inputs: StepInputs, rows: list[int], width: int) -> StepInputs:
    idx = torch.tensor(rows, dtype=torch.long)

    def take(t):
        return None if t is None else t[idx, :width]

    return StepInputs(
        take(inputs.old_logprobs), take(inputs.advantages), take(inputs.weights), take(inputs.ref_logprobs)
    )
