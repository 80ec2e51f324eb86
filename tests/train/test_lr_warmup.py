"""optim.warmup_steps (vlrl.train.trainer): the RL optimizer's lr ramps over its first steps, a resumed
optimizer continues the ramp where it stopped, and the SFT warm start's own AdamW never ramps."""

from __future__ import annotations

import io

import pytest
import torch

from vlrl.algos.config import AlgoConfig
from vlrl.train.config import ConfigError, OptimSection
from vlrl.train.trainer import Trainer

LR = 1e-2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _moves(trainer: Trainer, steps: int, seed: int = 1) -> list[float]:
    """Each step's largest |Δ weight| (AdamW's early steps move every weight by about its lr)."""
    gen, moves = torch.Generator().manual_seed(seed), []
    for _ in range(steps):
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.model(torch.randn(8, 16, generator=gen)).square().mean().backward()
        trainer._optimizer_step()
        after = [p.detach() for p in trainer.model.parameters()]
        moves.append(max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True)))
    return moves


def test_the_rl_lr_ramps_over_warmup_steps():
    plain = _moves(Trainer(_model(), AlgoConfig(), OptimSection(lr=LR, grad_clip=0)), 4)
    warm = _moves(Trainer(_model(), AlgoConfig(), OptimSection(lr=LR, grad_clip=0, warmup_steps=4)), 4)
    assert plain[0] == pytest.approx(LR, rel=1e-3)  # the fresh AdamW's first step: lr on the largest weight
    assert warm[0] == pytest.approx(LR / 4, rel=1e-3), warm  # step 1 of 4: a quarter of the lr
    assert warm[0] < warm[1] < warm[3] and warm[3] == pytest.approx(plain[3], rel=0.2), (warm, plain)


def test_a_resumed_optimizer_continues_its_warmup():
    optim = OptimSection(lr=LR, grad_clip=0, warmup_steps=10)
    first = Trainer(_model(), AlgoConfig(), optim)
    _moves(first, 3)
    buf = io.BytesIO()
    torch.save({"model": first.model.state_dict(), "optim": first.optimizer.state_dict()}, buf)
    saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    model = _model()
    model.load_state_dict(saved["model"])
    resumed = Trainer(model, AlgoConfig(), optim)
    resumed.optimizer.load_state_dict(saved["optim"])
    gen = torch.Generator().manual_seed(2)
    resumed.model(torch.randn(8, 16, generator=gen)).square().mean().backward()
    assert resumed._optimizer_step()["lr_factor"] == pytest.approx(0.4)  # step 4 of 10, not step 1 again
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [pytest.approx(0.4 * LR)]


def test_the_sft_optimizer_and_the_default_do_not_ramp():
    sft = Trainer(_model(), AlgoConfig(), OptimSection(lr=1e-4, grad_clip=0, warmup_steps=4), lr=LR)
    assert _moves(sft, 1)[0] == pytest.approx(LR, rel=1e-3)
    default = Trainer(_model(), AlgoConfig(), OptimSection(lr=LR))
    default.model(torch.randn(8, 16)).square().mean().backward()
    assert "lr_factor" not in default._optimizer_step()


def test_a_negative_warmup_is_a_config_error_that_names_it():
    with pytest.raises(ConfigError, match="optim.warmup_steps"):
        OptimSection(warmup_steps=-1)
