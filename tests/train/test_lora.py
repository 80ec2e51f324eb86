"""LoRA through peft, piece by piece: which layers get adapters, that only they train, that the merged
weights the engine gets are peft's own merge, and that a checkpoint holds the adapters alone."""

from __future__ import annotations

import copy

import pytest
import torch

from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.models.lora import apply_lora, base_checksum, lora_layers, merged_weights, target_modules
from vlrl.train.checkpoint import RunState, load_checkpoint, save_checkpoint
from vlrl.train.config import LORA_TARGETS


@pytest.fixture
def model():
    return load_model(cached_model_dir("qwen2_5_vl", "tiny"))


def test_targets_follow_the_vision_choice(model):
    frozen = target_modules(model, LORA_TARGETS, "frozen")
    adapted = target_modules(model, LORA_TARGETS, "adapted")
    # Qwen2.5-VL's vision MLP is also named gate/up/down_proj: a suffix match would adapt a frozen tower
    assert frozen and not any("visual" in n for n in frozen)
    assert set(frozen) < set(adapted)
    vision = {n for n in adapted if "visual" in n}
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith("model.visual.")}
    assert vision == linears and any("merger" in n for n in vision)  # tower and projector
    assert target_modules(model, ("q_proj",), "frozen") == [n for n in frozen if n.endswith("q_proj")]
    with pytest.raises(ValueError, match="no language-model linear layer"):
        target_modules(model, ("qproj",), "frozen")


def test_only_adapters_train_and_their_init_is_seeded(model):
    twin = copy.deepcopy(model)
    apply_lora(model, rank=4, alpha=8, targets=LORA_TARGETS, seed=3)
    apply_lora(twin, rank=4, alpha=8, targets=LORA_TARGETS, seed=3)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 2 * len(LORA_TARGETS)  # A and B, 2 layers
    twins = dict(twin.named_parameters())
    assert all(torch.equal(p, twins[n]) for n, p in model.named_parameters()), "every rank must start alike"


def test_merged_weights_are_peft_merge(model):
    apply_lora(model, rank=4, alpha=8, targets=LORA_TARGETS, vision="adapted")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:  # B starts at 0 (merge = base); give the adapters a real delta
                p.normal_(std=0.05)
    named = {n: p.detach() for n, p in model.named_parameters()}
    merged = merged_weights(named, lora_layers(model))
    reference = _peft_merge(model)
    base_names = [n for n, _ in load_model(cached_model_dir("qwen2_5_vl", "tiny")).named_parameters()]
    assert sorted(merged) == sorted(base_names) == sorted(reference)
    assert max(float((merged[n] - reference[n]).abs().max()) for n in merged) <= 1e-6
    delta = (
        merged["model.language_model.layers.0.self_attn.q_proj.weight"]
        - named["model.language_model.layers.0.self_attn.q_proj.base_layer.weight"]
    )
    assert float(delta.abs().max()) > 1e-3, "the test must merge a real delta"


def _peft_merge(model):
    """peft's own merge (``LoraLayer.merge``, what ``merge_and_unload`` calls) on a copy, under the base names."""
    from peft.tuners.lora import LoraLayer

    merged = copy.deepcopy(model)
    for module in merged.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    return {
        n.replace(".base_layer.", "."): p.detach()
        for n, p in merged.named_parameters()
        if ".lora_A." not in n and ".lora_B." not in n
    }


def test_a_lora_checkpoint_holds_the_adapters_alone(model, tmp_path):
    apply_lora(model, rank=4, alpha=8, targets=("q_proj", "v_proj"))
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for p in adapters.values():
            p.normal_()
    optimizer = torch.optim.AdamW(adapters.values(), lr=1e-2)
    sum(p.sum() for p in adapters.values()).backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "step_000001", model, optimizer, RunState(rl_step=1))
    saved = torch.load(path / "model.pt", weights_only=True)
    assert set(saved) == set(adapters), "only the adapters are checkpointed; the base is the model directory's"

    fresh = load_model(cached_model_dir("qwen2_5_vl", "tiny"))
    apply_lora(fresh, rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=1)  # other initial adapters
    _, restore = load_checkpoint(path, fresh)
    assert all(torch.equal(p, adapters[n]) for n, p in fresh.named_parameters() if n in adapters)
    assert base_checksum(fresh.named_parameters()) == base_checksum(model.named_parameters())
    again = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    restore(again)
    assert again.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"] == 1


def test_the_lora_config_is_typed_and_checked():
    from vlrl.errors import ConfigError
    from vlrl.train.cli import config_help
    from vlrl.train.config import load_config

    cfg = load_config("color_square", ["model.lora.rank=4", "model.lora.targets=['q_proj', 'v_proj']"])
    assert (cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.targets) == (4, 16.0, ("q_proj", "v_proj"))
    assert load_config("color_square").model.lora is None  # full fine-tuning unless asked
    assert "lora = { rank = 4," in cfg.to_toml()  # a run's config.toml loads back the same
    for bad, key in [
        ("model.lora.rank=0", "model.lora.rank"),
        ("model.lora.vision=open", "model.lora.vision"),
        ("model.lora.alpha=-1", "model.lora.alpha"),
        ("model.lora.ranks=4", "ranks"),
        ("model.lora.targets=[]", "model.lora.targets"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_config("color_square", [bad])
    assert "model.lora.vision = 'frozen'" in config_help()
