"""FSDP2 with vLLM rollouts: 2 torchrun processes (gloo) train, rank 0 drives the vLLM server over HTTP, and every
weight sync — the full state gathered from both ranks' shards — is probe-verified against a plain copy on rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.train]
ARCH = "qwen2_5_vl"  # the recipe's model


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_two_ranks_train_on_vllm_rollouts(vllm_stack, tiny, monkeypatch, tmp_path):
    stack = vllm_stack(ARCH)
    out = tmp_path / "run"
    env = {
        **os.environ,
        "VLRL_VLLM_URL": stack.url,
        "VLRL_VLLM_API_KEY": stack.config.api_key,
        "OMP_NUM_THREADS": "1",
        "VLRL_DEBUG": "1",
    }
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "vlrl",
        "train",
        "color_square",
        "rollout.engine=vllm",
        "run.steps=2",
        "sft.steps=2",
        "sft.rows_per_step=4",
        "rollout.rows_per_step=3",
        "rollout.repeats=3",
        "data.eval_rows=4",
        "run.eval_every=0",
        "run.samples=0",
        "algo.kl_coef=0.05",
        "run.progress=False",
        f"run.out={out}",
    ]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:  # the run synced its weights into the session's server: back to the checkpoint
        stack.engine.reload_checkpoint()
    assert done.returncode == 0, done.stderr[-6000:]
    agreement = _jsonl(out / "agreement.jsonl")
    assert [a["step"] for a in agreement] == [1, 2] and all(a["max_abs"] <= 1e-4 for a in agreement), agreement
    syncs = _jsonl(out / "weight_sync.jsonl")
    assert [s["version"] for s in syncs] == [1, 2, 3] and all(s["probe_max_abs"] <= 1e-4 for s in syncs), syncs
    assert (out / "checkpoints" / "step_000002" / "dcp").is_dir()
