"""Train-step throughput, MFU and peak memory, and the rollout-vs-trainer agreement of each engine measured.

The batch is the embedded engine's multi-turn rollout (maze2d, an image every turn: prompt, replies
and every earlier image). A timed step is what the trainer costs per RL step without the loss terms:
``Trainer.logprobs`` (forward, no grad) then ``Trainer.sft_step`` (forward, backward, AdamW).
MFU uses the update alone (:data:`vlrl.bench.flops.FORMULA`: 6·N·T is forward + backward).
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
from collections.abc import Sequence
from typing import Any

from vlrl.bench.env import now
from vlrl.bench.flops import FORMULA, count_params, peak_flops, train_flops


def agreement(model, trajectories: Sequence[Any], dtype: str, micro_batch: int) -> dict[str, Any]:
    """Engine logprobs (in the trajectories) vs the trainer's on the same tokens: the agreement check's statistics."""
    from vlrl.algos.config import AlgoConfig
    from vlrl.checks.agreement import batch_agreement
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.config import OptimSection
    from vlrl.train.trainer import Trainer

    trainer = Trainer(model, AlgoConfig(), OptimSection(micro_batch_size=micro_batch), lr=0.0)
    batch = collate(list(trajectories), CollateSpec.from_model(model)).to(trainer.device)
    report = batch_agreement(batch, trainer.logprobs(batch), dtype=dtype)
    return {
        **dataclasses.asdict(report.overall),
        "bounds": dataclasses.asdict(report.bounds),
        "breached": report.breached,
        "breaches": list(report.breaches),
        "by_depth": report.breakdown.rows()["by_depth"] if report.breakdown else [],
    }


def train_section(
    model, trajectories: Sequence[Any], *, dtype: str, device: str, device_name: str, micro_batch: int, steps: int
) -> dict[str, Any]:
    """Timed steps on the trajectories, padded rows; with ``packing`` too where the trainer has it."""
    n_lm, n_vis = _params(model)
    out: dict[str, Any] = {
        "formula": FORMULA,
        "n_lm": n_lm,
        "n_vis": n_vis,
        "peak_flops": peak_flops(device_name if device.startswith("cuda") else None, dtype),
        "micro_batch": micro_batch,
        "steps": steps,
        "padded": _timed(model, trajectories, device, micro_batch, steps, packing=False),
    }
    try:
        out["fast_vs_plain"] = fast_vs_plain(model, trajectories, dtype=dtype, micro_batch=micro_batch)
    except Exception as exc:  # noqa: BLE001 — as packing below: recorded, not fatal
        out["fast_vs_plain"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    try:
        out["packed"] = _timed(model, trajectories, device, micro_batch, steps, packing=True)
        out["packed_over_padded_tok_per_s"] = round(out["packed"]["tok_per_s"] / out["padded"]["tok_per_s"], 3)
    except Exception as exc:  # noqa: BLE001 — packing is optional here: recorded, not fatal
        out["packed"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    for run in (out["padded"], out["packed"]):
        if "update_s_median" in run:
            flops = train_flops(n_lm, run["tokens"], n_vis, run["patches"])
            run["train_flops"] = flops
            run["achieved_flops_per_s"] = flops / run["update_s_median"]
            run["mfu"] = run["achieved_flops_per_s"] / out["peak_flops"] if out["peak_flops"] else None
    return out


def fast_vs_plain(model, trajectories: Sequence[Any], *, dtype: str, micro_batch: int) -> dict[str, Any]:
    """The fast step's logprobs (rows packed, the model's kernels) against the plain forward's (padded rows,
    transformers' own kernels) on the same weights and tokens, under the dtype's agreement bounds."""
    from vlrl.algos.config import AlgoConfig
    from vlrl.checks.agreement import compare_logprobs
    from vlrl.models import fused
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.config import OptimSection
    from vlrl.train.trainer import Trainer

    def logprobs(packing: bool):
        optim = OptimSection(micro_batch_size=micro_batch, packing=packing)
        trainer = Trainer(model, AlgoConfig(), optim, lr=0.0)
        batch = collate(list(trajectories), CollateSpec.from_model(model)).to(trainer.device)
        return batch, trainer.logprobs(batch).logprobs

    batch, fast = logprobs(packing=True)
    installed = any(hasattr(m, fused.MARK) for m in model.modules())
    fused.uninstall(model)
    try:
        _, plain = logprobs(packing=False)
    finally:
        if installed:
            fused.install(model)
    report = compare_logprobs(fast, plain, batch.loss_mask, token_ids=batch.input_ids, dtype=dtype)
    return {
        "fast": {"packing": True, "kernels": "fused" if installed else "eager"},
        "plain": {"packing": False, "kernels": "eager"},
        **dataclasses.asdict(report.overall),
        "bounds": dataclasses.asdict(report.bounds),
        "breached": report.breached,
        "breaches": list(report.breaches),
    }


def _params(model) -> tuple[int, int]:
    head = model.get_output_embeddings().weight
    tied = head is model.get_input_embeddings().weight
    return count_params(((n, p.numel()) for n, p in model.named_parameters()), head.numel() if tied else 0)


def _timed(model, trajectories, device: str, micro_batch: int, steps: int, *, packing: bool) -> dict[str, Any]:
    """One warm-up step, then ``steps`` timed ones; medians, tokens, patches and peak memory."""
    import torch

    from vlrl.algos.config import AlgoConfig
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.config import OptimSection
    from vlrl.train.trainer import Trainer

    optim = OptimSection(micro_batch_size=micro_batch)
    if packing:
        if "packing" not in {f.name for f in dataclasses.fields(OptimSection)}:
            raise NotImplementedError("this trainer has no sample packing (OptimSection.packing)")
        optim = dataclasses.replace(optim, packing=True)  # type: ignore[call-arg]
    trainer = Trainer(model, AlgoConfig(), optim, lr=1e-6)
    batch = collate(list(trajectories), CollateSpec.from_model(model)).to(trainer.device)
    model.train()
    logprob_s, update_s = [], []
    for step in range(1 + steps):
        if step == 1 and device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = now(device)
        trainer.logprobs(batch)
        t1 = now(device)
        trainer.sft_step(batch)
        t2 = now(device)
        if step:
            logprob_s.append(t1 - t0)
            update_s.append(t2 - t1)
    model.eval()
    tokens = int(batch.seq_lens.sum())
    update = statistics.median(update_s)
    return {
        "rows": batch.size,
        "tokens": tokens,
        "padded_tokens": int(batch.input_ids.numel()),
        "patches": 0 if batch.pixel_values is None else int(batch.pixel_values.shape[0]),
        "logprobs_s_median": round(statistics.median(logprob_s), 4),
        "update_s_median": round(update, 4),
        "tok_per_s": round(tokens / update, 2),
        "forward_tok_per_s": round(tokens / statistics.median(logprob_s), 2),
        **_memory(device),
    }


def _memory(device: str) -> dict[str, float]:
    import torch

    if device.startswith("cuda"):
        return {"peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3)}
    # CPU: the process's peak resident set (Linux reports KiB): whole run, not one step
    return {"peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}
