"""`vlrl build-model` writes checkpoints that load back with the Auto classes, deterministically."""

from __future__ import annotations

import json

import pytest
import torch

from vlrl.cli import main


def test_build_model_cli_and_load_back(tmp_path, arch, capsys):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / arch
    assert main(["build-model", "--arch", arch, "--size", "tiny", "--seed", "7", "--out", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["arch"] == arch and info["seed"] == 7
    processor = AutoProcessor.from_pretrained(out)
    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    assert model.config.model_type == arch
    assert model.get_input_embeddings().weight.shape[0] == 151936
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"  # torchvision backend
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id == 151655
    assert sum(p.numel() for p in model.parameters()) == info["n_params"]
    assert 5e6 < info["n_params"] < 12e6


def test_weights_are_a_function_of_the_seed():
    from vlrl.models.build import build_model

    a, b, c = (build_model("qwen2_5_vl", "tiny", seed=s) for s in (1, 1, 2))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    differ = [k for k in sa if sa[k].ndim >= 2 and not torch.equal(sa[k], sc[k])]
    assert len(differ) == sum(1 for k in sa if sa[k].ndim >= 2)


def test_2b_size_has_the_benchmark_shape(arch):
    from transformers import AutoModelForImageTextToText

    from vlrl.models.build import build_config

    cfg = build_config(arch, "2b")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    t, v = cfg.text_config, cfg.vision_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.intermediate_size) == (
        1536,
        28,
        12,
        2,
        8960,
    )
    assert v.depth == 32
    assert 2.0e9 < n < 2.5e9, n


def test_fan_in_init_draws_each_matrix_at_its_fan_in_and_keeps_the_embeddings():
    """``fan_in``: N(0, 1/fan_in) per matrix (a [64, 64] projection at 1/8, the vision patch embedding at
    1/sqrt(3·2·14·14)), the token embedding at the size's std, 1-D parameters untouched; per-seed deterministic."""
    from vlrl.models.build import build_model, init_weights_

    model = build_model("qwen2_5_vl", "tiny", seed=0)
    init_weights_(model, 3, 0.02, "fan_in")
    p = dict(model.named_parameters())
    patch = p["model.visual.patch_embed.proj.weight"]
    assert patch[0].numel() == 1176 and abs(float(patch.std()) - 1176**-0.5) < 0.05 * 1176**-0.5
    q = p["model.language_model.layers.0.self_attn.q_proj.weight"]
    assert q.shape[1] == 64 and abs(float(q.std()) - 0.125) < 0.01
    assert abs(float(p["model.language_model.embed_tokens.weight"].std()) - 0.02) < 1e-3
    assert all(torch.all(w == 1) for n, w in p.items() if n.endswith("norm.weight"))
    again = build_model("qwen2_5_vl", "tiny", seed=0)
    init_weights_(again, 3, 0.02, "fan_in")
    assert all(torch.equal(w, dict(again.named_parameters())[n]) for n, w in p.items())
    with pytest.raises(ValueError, match="unknown init scheme 'xavier'"):
        init_weights_(again, 3, 0.02, "xavier")  # type: ignore[arg-type]
