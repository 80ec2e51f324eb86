"""fp32 master weights for bf16 runs (vlrl.train.master): small updates are kept, state resumes exactly."""

from __future__ import annotations

import io

import pytest
import torch

from vlrl.train.master import MasterAdamW

LR = 1e-5  # below half a bf16 ulp of a 0.02 weight (ulp 1.2e-4): a bf16 weight cannot take this step


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    return model.to(torch.bfloat16)


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, n: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(16, 32, generator=gen).to(torch.bfloat16)
        model(x).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_bf16_weights_drop_small_updates_and_masters_keep_them():
    plain, master = _model(), _model()
    start = [p.detach().clone() for p in plain.parameters()]
    _steps(plain, torch.optim.AdamW(plain.parameters(), lr=LR), 20)
    optimizer = MasterAdamW(master.parameters(), lr=LR)
    _steps(master, optimizer, 20)
    norm_w = 2  # the LayerNorm weight: ones, ulp 0.0078 — no AdamW step below 4e-3 can move it in bf16
    assert torch.equal(list(plain.parameters())[norm_w], start[norm_w])
    total = sum(s.numel() for s in start)
    moved_plain = sum(int((p != s).sum()) for p, s in zip(plain.parameters(), start, strict=True))
    assert moved_plain < 0.5 * total, (moved_plain, total)  # most bf16 weights never took a step
    # The masters took every step (Adam: about lr per coordinate per step; the random batches' gradients
    # point different ways, so 20 steps add up to less than 20 lr).
    shift = torch.cat(
        [
            (optimizer.state[p]["master"] - s.float()).abs().flatten()
            for p, s in zip(master.parameters(), start, strict=True)
        ]
    )
    assert float((shift > 0).float().mean()) > 0.99
    assert 4 * LR < float(shift.median()) <= 20 * LR, float(shift.median())


def test_master_step_is_fp32_adamw_on_the_masters():
    """Bit for bit: AdamW on fp32 copies fed the bf16 forward's gradients, rounded back after every step."""
    model, ref_model = _model(), _model()
    optimizer = MasterAdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    masters = [p.detach().float().clone().requires_grad_(True) for p in ref_model.parameters()]
    ref_opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01)
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(5):
        x = torch.randn(16, 32, generator=gen_a).to(torch.bfloat16)
        model(x).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(16, 32, generator=gen_b).to(torch.bfloat16)
        ref_model(x).float().square().mean().backward()
        for m, p in zip(masters, ref_model.parameters(), strict=True):
            m.grad = p.grad.float()
            p.grad = None
        ref_opt.step()
        with torch.no_grad():
            for m, p in zip(masters, ref_model.parameters(), strict=True):
                p.copy_(m)
    for p, m, q in zip(model.parameters(), masters, ref_model.parameters(), strict=True):
        assert torch.equal(optimizer.state[p]["master"], m.detach())
        assert optimizer.state[p]["exp_avg"].dtype == torch.float32
        assert torch.equal(p, q)


def test_masters_resume_exactly_from_a_saved_state():
    whole = _model()
    opt = MasterAdamW(whole.parameters(), lr=LR)
    _steps(whole, opt, 4, seed=1)
    _steps(whole, opt, 4, seed=2)

    first = _model()
    opt_a = MasterAdamW(first.parameters(), lr=LR)
    _steps(first, opt_a, 4, seed=1)
    buf = io.BytesIO()
    torch.save({"model": first.state_dict(), "optim": opt_a.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = _model(seed=9)
    resumed.load_state_dict(saved["model"])
    opt_b = MasterAdamW(resumed.parameters(), lr=LR)
    opt_b.load_state_dict(saved["optim"])  # over bf16 parameters: the masters must come back fp32
    assert all(opt_b.state[p]["master"].dtype == torch.float32 for p in resumed.parameters())
    _steps(resumed, opt_b, 4, seed=2)
    for p, q in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(("choice", "cls"), [("float32", MasterAdamW), ("model", torch.optim.AdamW)])
def test_the_config_chooses_the_optimizer(choice, cls):
    from vlrl.train.config import OptimSection
    from vlrl.train.trainer import make_optimizer

    optimizer = make_optimizer(_model(), 1e-4, OptimSection(master_weights=choice))
    assert type(optimizer) is cls


def test_a_vlrl_checkpoint_carries_the_fp32_masters(tmp_path):
    from vlrl.train.checkpoint import RunState, load_checkpoint, save_checkpoint

    model = _model()
    optimizer = MasterAdamW(model.parameters(), lr=LR)
    _steps(model, optimizer, 3)
    save_checkpoint(tmp_path / "ck", model, optimizer, RunState())
    again = _model(seed=5)
    _, restore = load_checkpoint(tmp_path / "ck", again)
    loaded = MasterAdamW(again.parameters(), lr=LR)
    assert restore is not None
    restore(loaded)
    for p, q in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q)
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert loaded.state[q][key].dtype == torch.float32
            assert torch.equal(loaded.state[q][key], optimizer.state[p][key])
