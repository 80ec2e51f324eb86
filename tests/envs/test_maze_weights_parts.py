"""A maze level's weights moved between device leases in parts (benchmarks/device/weights_parts.py).

The device tool brings back 64 MiB a call, so the curriculum's weights leave a lease as bf16 parts and come back
into the next one. What must hold: the unpacked directory is the packed one with every fp32 tensor rounded to bf16
and cast back (dtype, names and the other files unchanged), it loads as the policy, and a missing part is an error
that says so, not a model with holes. ~15 s on CPU (the tiny maze model).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_script import load  # tests/envs is on sys.path (as maze_cpu)
from safetensors.torch import load_file

from vlrl.envs.maze_models import start_checkpoint

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "weights_parts.py"


def _module():
    return load("device/weights_parts.py")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    src = Path(start_checkpoint("qwen2_5_vl", "tiny", "fan_in"))
    parts = tmp_path_factory.mktemp("parts")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "pack", str(src), str(parts), "--part-mib", "4"],
        capture_output=True,
        text=True,
        check=True,
    )
    return src, parts, out.stdout


def test_unpacked_weights_are_the_packed_ones_rounded_to_bf16(packed, tmp_path):
    src, parts, stdout = packed
    assert len(list(parts.glob("part.*"))) > 1, stdout  # split: the point of it
    dst = _module().unpack(parts, tmp_path / "w")
    before, after = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    assert before.keys() == after.keys()
    for name, t in before.items():
        assert after[name].dtype == t.dtype, name
        assert torch.equal(after[name], t.to(torch.bfloat16).to(t.dtype)), name
    assert any(not torch.equal(after[n], t) for n, t in before.items())  # rounded, so not a plain copy
    others = {p.name for p in src.iterdir() if p.is_file()} - {"model.safetensors"}
    assert others == {p.name for p in dst.iterdir()} - {"model.safetensors"}
    for name in others:
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name


def test_unpacked_directory_loads_as_the_policy(packed, tmp_path):
    from vlrl.models.load import load_model

    _, parts, _ = packed
    dst = _module().unpack(parts, tmp_path / "w")
    model, saved = load_model(dst, device="cpu"), load_file(dst / "model.safetensors")
    assert model.dtype == torch.float32
    # the file's names are the checkpoint's (transformers renames them on load): compare two tensors by role
    assert torch.equal(model.get_input_embeddings().weight, saved["model.embed_tokens.weight"])
    patch = next(t for n, t in saved.items() if n.endswith("patch_embed.proj.weight"))
    assert torch.equal(model.model.visual.patch_embed.proj.weight, patch)


@pytest.mark.parametrize("left_behind", [-1, 1], ids=["last", "second"])  # a cut stream / a gap in it
def test_a_missing_part_is_named_not_loaded(packed, tmp_path, left_behind):
    _, parts, _ = packed
    some = tmp_path / "some"
    some.mkdir()
    every = sorted(parts.glob("part.*"))
    for p in every[:left_behind] + (every[left_behind + 1 :] if left_behind >= 0 else []):
        (some / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ValueError, match="do not make a whole pack"):
        _module().unpack(some, tmp_path / "w")
    assert not (tmp_path / "w" / "model.safetensors").exists()


def test_the_tensor_bytes_travel_split_and_smaller(tmp_path, monkeypatch):
    """A bf16's high bytes (sign, exponent) apart from its low bytes compress where interleaved ones did not: the
    small model's pack is 61.1 MiB (4 parts, one call back) against 68.5 MiB (5 parts, two calls)."""
    mod = _module()
    src = Path(start_checkpoint("qwen2_5_vl", "tiny", "fan_in"))
    split = sum(p.stat().st_size for p in mod.pack(src, tmp_path / "split"))
    monkeypatch.setattr(mod, "_split", lambda data: (data, len(data)))  # the bytes as they were
    plain = sum(p.stat().st_size for p in mod.pack(src, tmp_path / "plain"))
    assert split < 0.92 * plain, (split, plain)
