"""``vlrl train color_square rollout.engine=vllm``: a short run with vLLM as the engine, agreement checked
every step (``run.agreement=stop``: a breach stops the run) and every weight sync probe-verified."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.vllm
ARCH = "qwen2_5_vl"  # the recipe's model


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_color_square_recipe_runs_on_vllm(vllm_stack, tiny, monkeypatch, tmp_path, record_property):
    from vlrl.cli import main

    stack = vllm_stack(ARCH)
    monkeypatch.setenv("VLRL_VLLM_URL", stack.url)  # the run attaches to the session's server (no extra start),
    monkeypatch.setenv("VLRL_VLLM_API_KEY", stack.config.api_key)  # with its key
    out = tmp_path / "run"
    try:
        rc = main(
            [
                "train",
                "color_square",
                "rollout.engine=vllm",
                "run.steps=2",
                "sft.steps=2",
                "sft.rows_per_step=8",
                "rollout.rows_per_step=4",
                "data.eval_rows=8",
                "run.eval_every=0",
                "run.agreement=stop",
                "run.progress=False",
                f"run.out={out}",
            ]
        )
    finally:  # the run synced its weights into the session's server: back to the checkpoint
        stack.engine.reload_checkpoint()
    assert rc == 0
    agreement = _jsonl(out / "agreement.jsonl")
    assert [a["step"] for a in agreement] == [1, 2]
    assert all(a["max_abs"] <= 1e-4 and not a["breached"] for a in agreement), agreement
    syncs = _jsonl(out / "weight_sync.jsonl")
    assert [s["version"] for s in syncs] == [1, 2, 3]  # after SFT, after each RL step
    assert all(s["probe_max_abs"] <= 1e-4 for s in syncs), syncs
    assert all(s["route"] == "checkpoint" and s["sync_s"] > 0 and s["probe_tol"] == 1e-4 for s in syncs), syncs
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval_after"] is not None
    record_property("agreement_max_abs", [a["max_abs"] for a in agreement])
    record_property("sync_probe_max_abs", [s["probe_max_abs"] for s in syncs])
    assert stack.engine.verify_weights(tiny(ARCH).model) <= 1e-4


def test_a_dropped_sync_stops_the_run(vllm_stack, monkeypatch, tmp_path):
    """If the server does not take the new weights, the run stops at that sync (no silent staleness)."""
    from vlrl.train.config import load_config
    from vlrl.train.loop import train
    from vlrl.train.run import WeightSyncError
    from vlrl.vllm.engine import VllmEngine

    stack = vllm_stack(ARCH)
    monkeypatch.setenv("VLRL_VLLM_URL", stack.url)
    monkeypatch.setenv("VLRL_VLLM_API_KEY", stack.config.api_key)
    monkeypatch.setattr(VllmEngine, "update_weights", lambda self, named, version=None, **kw: version)  # drops them
    cfg = load_config(
        "color_square",
        [
            "rollout.engine=vllm",
            "run.steps=1",
            "sft.steps=1",
            "sft.rows_per_step=8",
            "data.eval_rows=4",
            "run.progress=False",
            f"run.out={tmp_path / 'run'}",
        ],
    )
    try:
        with pytest.raises(WeightSyncError, match="does not hold the trainer's weights"):
            train(cfg)
    finally:
        stack.engine.reload_checkpoint()
