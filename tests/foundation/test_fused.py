"""vlrl.models.fused: its functions are transformers' own math, and install() routes every RMSNorm, SwiGLU MLP
and rotary call of a model through them for half-precision CUDA inputs only (compilation itself runs on the GPU:
tests/gpu/test_gpu_kernels.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from vlrl.models import fused
from vlrl.models.load import load_model, load_processor

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture
def qwen25():
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m

    return m


@pytest.mark.parametrize("dtype", DTYPES)
def test_functions_are_transformers_math_bit_for_bit(qwen25, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 64, generator=g).to(dtype)
    norm = qwen25.Qwen2_5_VLRMSNorm(64, eps=1e-6).to(dtype)
    torch.nn.init.normal_(norm.weight, generator=g)
    assert torch.equal(fused.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))

    q, k = torch.randn(2, 4, 7, 16, generator=g).to(dtype), torch.randn(2, 2, 7, 16, generator=g).to(dtype)
    cos, sin = torch.randn(2, 7, 16, generator=g).to(dtype), torch.randn(2, 7, 16, generator=g).to(dtype)
    for mine, theirs in zip(fused.rotary(q, k, cos, sin), qwen25.apply_rotary_pos_emb(q, k, cos, sin), strict=True):
        assert torch.equal(mine, theirs)

    qv, kv = torch.randn(9, 4, 16, generator=g).to(dtype), torch.randn(9, 4, 16, generator=g).to(dtype)
    cv, sv = torch.randn(9, 16, generator=g), torch.randn(9, 16, generator=g)
    pairs = zip(fused.rotary_vision(qv, kv, cv, sv), qwen25.apply_rotary_pos_emb_vision(qv, kv, cv, sv), strict=True)
    for mine, theirs in pairs:
        assert torch.equal(mine, theirs)

    gate, up = torch.randn(3, 32, generator=g).to(dtype), torch.randn(3, 32, generator=g).to(dtype)
    assert torch.equal(fused.silu_mul(gate, up), torch.nn.SiLU()(gate) * up)


def _inputs(model_dir):
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (112, 140, 3), dtype=np.uint8))
    text = "Where is the goal? <|vision_start|><|image_pad|><|vision_end|> left or right"
    return load_processor(model_dir)(text=[text], images=[image], return_tensors="pt")


def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        kwargs = dict(inputs) | {"pixel_values": inputs["pixel_values"].to(model.dtype)}
        return model(**kwargs).logits


EXPECTED = {  # arch -> (patched classes, rotary fused); counts per class from the config below
    "qwen2_5_vl": (
        {"Qwen2_5_VLRMSNorm", "Qwen2MLP", "Qwen2_5_VLMLP", "Qwen2_5_VLAttention", "Qwen2_5_VLVisionAttention"},
        True,
    ),
    "qwen2_vl": ({"Qwen2VLRMSNorm", "Qwen2MLP"}, False),
    "qwen3_vl": ({"Qwen3VLTextRMSNorm", "Qwen3VLTextMLP"}, False),
}


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_install_routes_every_module_and_changes_nothing_off_the_gpu(arch, vlrl_model_dir, monkeypatch):
    model_dir = vlrl_model_dir(arch)
    model = load_model(model_dir, dtype=torch.bfloat16, kernels="fused")
    eager = load_model(model_dir, dtype=torch.bfloat16)  # kernels="eager" is the default
    assert not any(hasattr(m, fused.MARK) for m in eager.modules())
    classes, fuses_rotary = EXPECTED[arch]
    patched = [type(m).__name__ for m in model.modules() if hasattr(m, fused.MARK)]
    assert set(patched) == classes
    assert fused.install(model) == 0  # idempotent
    copied = copy.deepcopy(model)  # what `vlrl train` hands its embedded engine: the patches follow the copy
    assert all(m.forward.__self__ is m for m in copied.modules() if hasattr(m, fused.MARK))
    inputs = _inputs(model_dir)
    reference = _logits(eager, inputs)
    assert torch.equal(_logits(model, inputs), reference)  # CPU: not eligible, transformers' own path

    # The fused path's wiring, without a compiler: every input eligible, "compiled" the plain function.
    calls: dict[str, int] = {}

    def counted(fn):
        def call(*args):
            calls[fn.__name__] = calls.get(fn.__name__, 0) + 1
            return fn(*args)

        return call

    monkeypatch.setattr(fused, "eligible", lambda x: True)
    monkeypatch.setattr(fused, "compiled", counted)
    assert torch.equal(_logits(model, inputs), reference)
    norms = sum(n in fused.NORMS for n in patched)
    mlps = sum(n in fused.MLPS for n in patched)
    text, vision = model.config.text_config, model.config.vision_config
    want = {"rms_norm": norms, "silu_mul": mlps}
    if fuses_rotary:
        want |= {"rotary": text.num_hidden_layers, "rotary_vision": vision.depth}
    assert calls == want and norms > 0 and mlps > 0
    calls.clear()
    assert torch.equal(_logits(eager, inputs), reference) and calls == {}  # another model in the process: untouched
    fused.uninstall(model)
    assert torch.equal(_logits(model, inputs), reference) and calls == {}


def test_config_choice_is_the_modules(vlrl_model_dir):
    import argparse
    from typing import get_args

    from vlrl.bench.cli import add_arguments, config_from
    from vlrl.errors import ConfigError
    from vlrl.train.config import Kernels, load_config

    assert get_args(Kernels) == get_args(fused.Kernels)
    assert load_config("color_square", ["model.kernels=fused"]).model.kernels == "fused"
    with pytest.raises(ConfigError, match="model.kernels"):
        load_config("color_square", ["model.kernels=triton"])
    with pytest.raises(ValueError, match="kernels must be one of fused, eager, got 'triton'"):
        load_model(vlrl_model_dir("qwen2_5_vl"), kernels="triton")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from(parser.parse_args(["--kernels", "fused"])).kernels == "fused"
    assert config_from(parser.parse_args([])).kernels == "eager"
