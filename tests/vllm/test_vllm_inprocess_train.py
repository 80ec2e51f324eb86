"""``vlrl train color_square rollout.engine=vllm rollout.vllm_mode=inprocess``: a short run on vLLM in the trainer's
process, agreement checked every step and every weight sync probe-verified (after ``test_vllm_inprocess.py``, on the
same worker, whose engine is closed by then)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.vllm
XDIST_GROUP = "vllm_inprocess"  # pytest_vlrl.parallel: beside the servers' worker


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("logprobs", ["vllm", "sampler"])
def test_color_square_recipe_runs_on_inprocess_vllm(tmp_path, logprobs):
    """The same run with vLLM in the trainer's process (``rollout.vllm_mode=inprocess``): agreement every step,
    every sync probe-verified; the sampled tokens' logprobs as vLLM reports them, or kept in its worker's sampler
    (``rollout.vllm_logprobs=sampler``)."""
    from pytest_vlrl.vllm import require_vllm
    from vlrl.cli import main

    require_vllm()
    out = tmp_path / "run"
    args = ["rollout.engine=vllm", "rollout.vllm_mode=inprocess", "run.steps=2", "sft.steps=2", "sft.rows_per_step=8"]
    args += ["rollout.rows_per_step=4", "data.eval_rows=8", "run.eval_every=0", "run.agreement=stop"]
    args += [f"rollout.vllm_logprobs={logprobs}"]
    assert main(["train", "color_square", *args, "run.progress=False", f"run.out={out}"]) == 0
    agreement = _jsonl(out / "agreement.jsonl")
    assert [a["step"] for a in agreement] == [1, 2]
    assert all(a["max_abs"] <= 1e-4 and not a["breached"] for a in agreement), agreement
    syncs = _jsonl(out / "weight_sync.jsonl")
    assert [s["version"] for s in syncs] == [1, 2, 3]
    assert all(s["probe_max_abs"] <= 1e-4 and s["route"] == "checkpoint" and s["sync_s"] > 0 for s in syncs), syncs
