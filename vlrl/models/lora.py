"""LoRA through peft: adapters on a Qwen-VL model, their merged weights for an engine, the base's checksum.

``apply_lora`` injects peft's LoRA layers into the Hugging Face model *in place* and freezes everything
else, so the trainer, the chunked forward and FSDP2 see the same model object they always do (its
``model.model`` and ``get_output_embeddings()`` unchanged), only with adapters. A LoRA layer's
parameters are renamed by peft: ``…q_proj.weight`` becomes ``…q_proj.base_layer.weight`` beside
``…q_proj.lora_A.default.weight`` and ``…lora_B.default.weight``.

The engine never sees adapters: it holds a plain copy of the base model and is sent **merged** weights
under the base names (``merged_weights``: ``W + scaling · B @ A``, peft's own formula, checked against
``merge_and_unload`` in the tests), so the existing checksum path compares the trainer's merged weights
with the engine's, and rollout and trainer compute the same function (up to float rounding of the merge).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import torch

ADAPTER = "default"
"""peft's adapter name (one adapter per model here)."""

VISION_PREFIX = "model.visual."
"""Qwen-VL's vision tower and projector (``model.visual.{patch_embed,blocks,merger}``)."""


def target_modules(model: torch.nn.Module, targets: Sequence[str], vision: Literal["frozen", "adapted"]) -> list[str]:
    """Full names of the linear layers to adapt: the language model's whose last name part is in ``targets``,
    and with ``vision="adapted"`` every linear layer of the vision tower and projector.

    Full names, not peft's suffix matching: Qwen2.5-VL's vision MLP is also called ``gate_proj/up_proj/
    down_proj``, and a suffix would put adapters on a tower the config says is frozen.
    """
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        in_vision = name.startswith(VISION_PREFIX)
        if (in_vision and vision == "adapted") or (not in_vision and name.rsplit(".", 1)[-1] in targets):
            names.append(name)
    if not any(not n.startswith(VISION_PREFIX) for n in names):
        raise ValueError(
            f"model.lora.targets = {tuple(targets)}: no language-model linear layer has one of these "
            "names (Qwen-VL: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
        )
    return names


def apply_lora(
    model: torch.nn.Module,
    *,
    rank: int,
    alpha: float,
    targets: Sequence[str],
    vision: Literal["frozen", "adapted"] = "frozen",
    seed: int = 0,
) -> torch.nn.Module:
    """Inject LoRA adapters into ``model`` in place (peft) and freeze every other parameter; returns ``model``.

    ``seed`` fixes the adapters' initialisation (peft draws ``lora_A`` from torch's global generator):
    every rank of a distributed run must start from the same adapters, and a resumed run's are
    overwritten by the checkpoint anyway. The global generator is left as it was.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int, but only ever computes alpha / r
        lora_dropout=0.0,
        bias="none",
        target_modules=target_modules(model, targets, vision),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    assert peft_model.base_model.model is model  # peft adapts in place; the wrapper itself is not needed
    return model


def lora_layers(model: torch.nn.Module) -> dict[str, tuple[float, bool]]:
    """``{module name: (scaling, fan_in_fan_out)}`` of every LoRA layer in ``model`` (empty without LoRA)."""
    from peft.tuners.lora import LoraLayer

    return {
        name: (float(m.scaling[ADAPTER]), bool(getattr(m, "fan_in_fan_out", False)))
        for name, m in model.named_modules()
        if isinstance(m, LoraLayer)
    }


def is_lora(model: torch.nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


def merged_weights(
    weights: Mapping[str, torch.Tensor], layers: Mapping[str, tuple[float, bool]], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The base model's weights with every adapter merged in, under the base model's names.

    ``weights``: ``{name: full tensor}`` of the adapted model (its ``named_parameters``, or the full state
    gathered from FSDP shards); ``layers``: ``lora_layers(model)``. Each adapted ``W`` becomes
    ``W + scaling · (B @ A)`` (transposed for fan-in-fan-out layers), computed in fp32 and cast to ``dtype``
    (default: the base weight's). Adapter tensors are left out.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        prefix, sep, leaf = name.rpartition(".base_layer.")
        if not sep:
            out[name] = tensor if dtype is None else tensor.to(dtype)
            continue
        if leaf == "weight" and prefix in layers:
            scaling, fan_in_fan_out = layers[prefix]
            a = weights[f"{prefix}.lora_A.{ADAPTER}.weight"].float()
            b = weights[f"{prefix}.lora_B.{ADAPTER}.weight"].float()
            delta = b @ a
            tensor = (tensor.float() + scaling * (delta.T if fan_in_fan_out else delta)).to(dtype or tensor.dtype)
        out[f"{prefix}.{leaf}"] = tensor if dtype is None else tensor.to(dtype)
    return out


def base_checksum(named_parameters: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over the frozen base weights (every parameter but the adapters), by name: equal before and
    after a LoRA run exactly when no base weight moved."""
    h = hashlib.sha256()
    for name, p in sorted(named_parameters, key=lambda item: item[0]):
        if ".lora_A." in name or ".lora_B." in name:
            continue
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
