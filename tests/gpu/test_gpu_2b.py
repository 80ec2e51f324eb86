"""The 2b Qwen2.5-VL (≈2.4 B parameters, two kv heads) on the GPU in bf16: the embedded engine generates,
the trainer's forward agrees with it within the bf16 bound, and one backward reaches every parameter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
import traj_helpers as H

pytestmark = pytest.mark.gpu


def test_2b_generate_agree_forward_backward(vlrl_model_dir):
    import torch

    from vlrl.checks.agreement import batch_agreement
    from vlrl.engines.embedded import EmbeddedEngine
    from vlrl.engines.types import SamplingParams
    from vlrl.models.load import load_model, load_processor
    from vlrl.render.embedded import EmbeddedRenderer
    from vlrl.train.batch import CollateSpec, collate
    from vlrl.train.forward import policy_forward

    path = vlrl_model_dir("qwen2_5_vl", "2b")
    model = load_model(path, dtype=torch.bfloat16, device="cuda")
    renderer = EmbeddedRenderer.from_pretrained(path)
    engine = EmbeddedEngine(model, load_processor(path).tokenizer)
    convs = list(H.conversations().values())
    prompts = [renderer.render(c) for c in convs]
    gens = engine.generate(
        prompts, [SamplingParams(temperature=1.0, max_tokens=16, seed=i, ignore_eos=True) for i in range(len(prompts))]
    )
    batch = collate(
        [H.trajectory(f"t{i}", p, g, 1.0) for i, (p, g) in enumerate(zip(prompts, gens))], CollateSpec.from_model(model)
    ).to("cuda")
    model.train()
    out = policy_forward(model, batch)
    report = batch_agreement(batch, out, dtype="bfloat16")
    print(report.summary())
    assert not report.breached, report.summary()
    loss = -(out.logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
    loss.backward()
    params = dict(model.named_parameters())
    no_grad = [n for n, p in params.items() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not no_grad, f"{len(no_grad)} of {len(params)} parameters got no gradient: {no_grad[:6]}"
    assert all(bool(torch.isfinite(p.grad).all()) for p in params.values())
