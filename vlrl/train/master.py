"""AdamW with fp32 master weights for low-precision (bf16 / fp16) parameters.

Why: a bf16 weight only moves when its update exceeds half of its ulp. AdamW moves each coordinate by about
``lr`` per step, and bf16 holds 8 significant bits, so at ``lr = 1e-5`` no weight with ``|w| > 0.004`` moves at
all (a 0.02 weight has an ulp of 1.2e-4) and norm weights near 1 need ``lr > 4e-3``: a bf16 run that keeps
bf16 weights silently trains a fraction of the model. Measured on the H100 (2b model, lr 1e-5,
tests/gpu/test_fsdp_gpu.py): after 3 steps a bf16-weight trainer and an fp32-master one disagreed by a mean
0.036 nats per token — the bf16 one had dropped most of its updates.

How: the optimizer keeps ``state["master"]``, an fp32 copy of every low-precision parameter; each step runs
AdamW on the masters (with the gradient cast to fp32, Adam moments in fp32) and writes the rounded result back
to the parameter, so the model, the engine and the checkpoint's model weights stay in the run's dtype. The
masters live in the optimizer state, so ``optimizer.pt`` / DCP checkpoints carry them and resume exactly
(``load_state_dict`` would cast them to the parameter's dtype; the hooks below keep them fp32). fp32
parameters (CPU runs, FSDP's sharded fp32 masters) are stepped as plain AdamW.
"""

from __future__ import annotations

from typing import Any

import torch

KEEP_FP32 = ("master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
"""State entries that stay fp32 when a checkpoint is loaded into an optimizer over bf16 parameters."""


class MasterAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that steps fp32 masters of its low-precision parameters (module docstring)."""

    def __init__(self, params, **kwargs: Any):
        super().__init__(params, **kwargs)
        self._loading: dict[int, dict[str, torch.Tensor]] = {}
        self.register_load_state_dict_pre_hook(_keep_fp32_before_load)
        self.register_load_state_dict_post_hook(_restore_fp32_after_load)

    @torch.no_grad()
    def step(self, closure=None):
        low = [
            p for group in self.param_groups for p in group["params"] if p.grad is not None and p.dtype != torch.float32
        ]
        swapped = []
        for p in low:  # point the parameter at its master for the step, then round the result back
            master = self.state[p].get("master")
            if master is None:  # first step: AdamW initialises its state only while the state is empty
                master = p.detach().to(torch.float32).clone()
            swapped.append((p, p.data, p.grad, master))
            p.data, p.grad = master, p.grad.to(torch.float32)
        try:
            loss = super().step(closure)
        finally:
            for p, data, grad, master in swapped:
                self.state[p]["master"] = master
                data.copy_(master)
                p.data, p.grad = data, grad
        return loss


def _keep_fp32_before_load(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    assert isinstance(optimizer, MasterAdamW)
    # load_state_dict casts floating state to the parameter's dtype: remember the fp32 values, keyed by the
    # parameter they belong to. Saved keys (indices, or names under torch.distributed's state dicts) map to
    # parameters by position in the param groups, as load_state_dict maps them.
    saved_keys = [k for group in state_dict["param_groups"] for k in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    by_key = dict(zip(saved_keys, params, strict=False))
    optimizer._loading = {
        id(by_key[k]): {n: v.clone() for n, v in s.items() if n in KEEP_FP32 and torch.is_tensor(v)}
        for k, s in state_dict.get("state", {}).items()
        if k in by_key
    }


def _restore_fp32_after_load(optimizer: torch.optim.Optimizer) -> None:
    assert isinstance(optimizer, MasterAdamW)
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer._loading.get(id(p), {}).items():
                optimizer.state[p][key] = value.to(device=p.device, dtype=torch.float32)
    optimizer._loading = {}


@torch.no_grad()
def round_masters_(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Round fp32 parameters to the values ``dtype`` holds, in place (they stay fp32); returns ``model``.

    Why: FSDP keeps its fp32 masters as the sharded parameters, loaded from the checkpoint, while a plain
    run loads the model in ``dtype`` and starts its masters from those rounded weights. From an fp32
    checkpoint (vlrl's random-init models) the two would start from different masters: the same compute
    weights, but different distances to the next bf16 rounding step, so from the first update on they
    round to different weights: on CPU (tiny, bf16) the second SFT loss 1.2e-3 apart without this, 8e-5 with
    it (tests/train/test_fsdp.py); the 2b policies on the H100 were 0.18 nats per token apart after two SFT
    steps (tests/gpu/test_fsdp_gpu.py). Real checkpoints are stored in bf16 and are unchanged by this.
    """
    for p in model.parameters():
        if p.dtype == torch.float32:
            p.copy_(p.to(dtype))
    return model
