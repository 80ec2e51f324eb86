"""``vlrl.train.trainer.clip_gradients``: the norms and the clipping of ``torch.nn.utils.clip_grad_norm_``, by module
group, in one pass (the FSDP2 path, with sharded gradients summed over ranks, is tests/train/test_fsdp.py's)."""

from __future__ import annotations

import math

import pytest
import torch

from vlrl.train.trainer import clip_gradients


class Toy(torch.nn.Module):
    """Parameters named as a Qwen-VL's groups are: vision, merger, embed, language (and one without a gradient)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.visual = torch.nn.Linear(3, 2, dtype=dtype)
        self.embed_tokens = torch.nn.Embedding(4, 2, dtype=dtype)
        self.layers = torch.nn.Linear(2, 2, dtype=dtype)
        self.merger = torch.nn.Linear(2, 1, bias=False, dtype=dtype)


def with_grads(dtype: torch.dtype, seed: int = 0) -> Toy:
    torch.manual_seed(seed)
    model = Toy(dtype)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 3
    model.merger.weight.grad = None  # no gradient: left out of every norm
    return model


def test_group_norms_are_the_square_roots_of_their_parameters_squares():
    model = with_grads(torch.float32)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    norms = clip_gradients(model, math.inf)

    def norm(*prefixes):
        return math.sqrt(sum(float(g.double().square().sum()) for n, g in grads.items() if n.startswith(prefixes)))

    assert norms["grad_norm/vision"] == pytest.approx(norm("visual"), rel=1e-6)
    assert norms["grad_norm/embed"] == pytest.approx(norm("embed_tokens"), rel=1e-6)
    assert norms["grad_norm/language"] == pytest.approx(norm("layers"), rel=1e-6)
    assert "grad_norm/merger" not in norms
    assert norms["grad_norm"] == pytest.approx(norm(""), rel=1e-6)
    for n, p in model.named_parameters():  # measured only: nothing scaled
        if p.grad is not None:
            assert torch.equal(p.grad, grads[n])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_norm", [0.5, 1e4])
def test_clipping_scales_as_torch_clip_grad_norm(dtype, max_norm):
    ours, theirs = with_grads(dtype), with_grads(dtype)
    norm = clip_gradients(ours, max_norm)["grad_norm"]
    # torch's clipping on fp32 copies (on bf16 gradients its total norm is itself rounded to bf16)
    reference = []
    for p in theirs.parameters():
        if p.grad is not None:
            reference.append(torch.nn.Parameter(p.detach().float()))
            reference[-1].grad = p.grad.float()
    expected = float(torch.nn.utils.clip_grad_norm_(reference, max_norm))
    assert norm == pytest.approx(expected, rel=1e-5)
    got = [p.grad for p in ours.parameters() if p.grad is not None]
    for g, r in zip(got, reference, strict=True):
        assert g.dtype == dtype
        exact = dtype == torch.float32
        torch.testing.assert_close(g.float(), r.grad.to(dtype).float(), rtol=1e-6 if exact else 1e-2, atol=0)
    if max_norm < expected:  # clipped: the new norm is max_norm
        assert clip_gradients(ours, math.inf)["grad_norm"] == pytest.approx(max_norm, rel=1e-2)


def test_a_model_without_gradients_has_norm_zero():
    assert clip_gradients(Toy(torch.float32), 1.0) == {"grad_norm": 0.0}
