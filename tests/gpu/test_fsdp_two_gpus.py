"""FSDP2 on two GPUs through NCCL (skipped with fewer): the CPU/gloo proofs of tests/train/test_fsdp.py, on CUDA.

The tiny color_square run (one SFT step, two RL steps with KL, fp32: TF32 off) on ``torchrun --nproc-per-node 2``
takes the one-process run's steps, and its distributed checkpoint resumes in one process with the same next step.
Tolerance as on CPU (1e-5, see tests/train/test_fsdp.py): the ranks sum the same gradients in another order.
Run by ``benchmarks/device/two_gpu.sh`` on nvidia-h200-x2 (``NCCL_NVLS_ENABLE=0``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
from fsdp_helpers import checkpoint_weights, max_abs_diff, phase, run_plain, run_torchrun

from vlrl.checks.training import RunRecord, agreement_held

pytestmark = pytest.mark.gpu

TOL = 1e-5
CUDA = ("model.device=cuda",)


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not _two_gpus():
        pytest.skip("needs two CUDA GPUs")
    root = tmp_path_factory.mktemp("fsdp2gpu")
    return run_plain(root / "one", *CUDA), run_torchrun(2, root / "two", *CUDA)


def _same_steps(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b, strict=True):
        for key in keys:
            assert abs(x[key] - y[key]) <= TOL * max(1.0, abs(x[key])), (x["phase"], x["step"], key, x[key], y[key])


def test_two_gpus_take_the_one_gpu_steps(runs):
    one, two = runs
    _same_steps(phase(one, "sft"), phase(two, "sft"), ("loss", "grad_norm"))
    _same_steps(phase(one, "rl"), phase(two, "rl"), ("loss", "grad_norm", "entropy", "reward_mean"))
    assert all(m["grad_norm"] > 0 for m in phase(one, "rl")), "the RL steps must train, or equality proves nothing"
    for step in ("step_000000", "step_000001", "step_000002"):
        diff, name = max_abs_diff(
            checkpoint_weights(one / "checkpoints" / step), checkpoint_weights(two / "checkpoints" / step)
        )
        assert diff <= TOL, f"{step}: {name} differs by {diff:.2e}"
    agreement_held(RunRecord.load(two), steps=2)


def test_a_two_gpu_checkpoint_resumes_on_one_gpu(runs, tmp_path):
    _, two = runs
    resumed = run_plain(tmp_path / "resumed", *CUDA, f"run.resume={two / 'checkpoints' / 'step_000001'}")
    _same_steps(phase(two, "rl")[1:], phase(resumed, "rl"), ("loss", "grad_norm", "entropy"))
    diff, name = max_abs_diff(
        checkpoint_weights(two / "checkpoints" / "step_000002"),
        checkpoint_weights(resumed / "checkpoints" / "step_000002"),
    )
    assert diff <= TOL, f"{name} differs by {diff:.2e}"
