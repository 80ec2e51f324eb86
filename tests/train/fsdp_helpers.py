"""Runs for the FSDP2 tests: the tiny color_square recipe in one plain process (in pytest's) or in N torchrun
processes (gloo), and their checkpoints' weights and metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from vlrl.checks.training import RunRecord
from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.train.checkpoint import load_checkpoint
from vlrl.train.config import load_config
from vlrl.train.loop import train

STEPS = (
    "sft.steps=1",
    "sft.rows_per_step=4",
    "sft.lr=1e-3",
    "rollout.rows_per_step=3",
    "rollout.repeats=3",
    "data.eval_rows=4",
    "data.train_rows=16",
    "run.eval_every=0",
    "run.samples=1",
    "run.progress=False",
    "run.steps=2",
    "run.checkpoint_every=1",
    "algo.kl_coef=0.05",
)
"""One SFT step and two RL steps. KL to the reference gives every RL step a gradient even where all rewards
are 0 (the random init's). 9 trajectories a step: 5 + 4 rows on two ranks (one padding row), so the ranks
hold different numbers of tokens and a mean of per-rank means differs from the global token mean."""


def run_plain(out: Path, *overrides: str) -> Path:
    train(load_config("color_square", [*STEPS, *overrides, f"run.out={out}"]))
    return out


def run_torchrun(nproc: int, out: Path, *overrides: str, timeout: int = 600) -> Path:
    """``torchrun --standalone --nproc-per-node N -m vlrl train color_square …``; fails the test with its output."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "vlrl",
        "train",
        "color_square",
        *STEPS,
        *overrides,
        f"run.out={out}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLRL_DEBUG": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"torchrun exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return out


def phase(run_dir: Path, name: str) -> list[dict]:
    return RunRecord.load(run_dir).phase(name)


def checkpoint_weights(path: Path, lora: dict | None = None) -> dict[str, torch.Tensor]:
    """A checkpoint (either format) loaded into a plain model of the tiny checkpoint: ``{name: tensor}``."""
    model = load_model(cached_model_dir("qwen2_5_vl", "tiny"))
    if lora:
        from vlrl.models.lora import apply_lora

        apply_lora(model, **lora)
    load_checkpoint(path, model)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    assert a.keys() == b.keys()
    return max((float((a[n] - b[n]).abs().max()), n) for n in a)
