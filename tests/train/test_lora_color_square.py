"""A LoRA run learns color_square (recipe vlrl/recipes/color_square_lora.toml) with the base weights untouched,
the engine sampling with the adapters merged in, and rollout and trainer agreeing at every step."""

from __future__ import annotations

import pytest
import torch

from vlrl.checks.agreement import LogprobDisagreementError
from vlrl.models.lora import base_checksum, lora_layers, merged_weights
from vlrl.train.config import load_config
from vlrl.train.loop import train

pytestmark = pytest.mark.train


def test_lora_color_square_learns_with_only_the_adapters_changed(vlrl_train):
    run = vlrl_train("color_square_lora")
    run.assert_learned(0.9)
    run.assert_agreement_held()  # trainer (adapters) vs engine (merged weights), every RL step
    run.assert_all_parameters_changed()  # every trainable parameter is an adapter, and each one moved
    final = dict(run._final.named_parameters())
    assert all(".lora_" in n for n, p in final.items() if p.requires_grad)
    assert base_checksum(final.items()) == base_checksum(run._initial.items()), "a base weight moved"
    assert any(m["grad_norm"] > 0 for m in run.record.phase("rl")), "the RL steps must move the adapters too"

    # The engine was sent the merged weights (each sync checksum-verified): not the base's
    merged = merged_weights({n: p.detach() for n, p in final.items()}, lora_layers(run._final))
    base = merged_weights(run._initial, lora_layers(run._final))  # adapters at init: B = 0, merge = base
    moved = [n for n in merged if not torch.equal(merged[n], base[n])]
    assert moved and all(n.endswith(".weight") and "language_model" in n for n in moved)

    saved = torch.load(run.dir / "checkpoints" / "step_000006" / "model.pt", weights_only=True)
    assert set(saved) == {n for n, p in final.items() if p.requires_grad}, "only the adapters are checkpointed"


def test_an_engine_without_the_merge_breaks_agreement(tmp_path, monkeypatch):
    """The guard behind the test above: an engine sent the base weights (adapters not merged) samples from
    another policy, and the run stops at the first RL step."""
    import vlrl.train.run as run_module

    monkeypatch.setattr(
        run_module,
        "merged_weights",
        lambda full, layers, dtype=None: {
            n.replace(".base_layer.", "."): t.to(dtype) for n, t in full.items() if ".lora_" not in n
        },
    )
    cfg = load_config(
        "color_square_lora",
        [
            "sft.steps=3",
            "run.steps=1",
            "data.eval_rows=4",
            "run.samples=0",
            "rollout.rows_per_step=4",
            f"run.out={tmp_path}",
            "run.progress=False",
        ],
    )
    with pytest.raises(LogprobDisagreementError):
        train(cfg)
