"""The maze curriculum's random-init models: vlrl's ``tiny`` size or :data:`SMALL`, drawn by either init scheme
(:data:`vlrl.models.build.InitScheme`), built once into the vlrl cache beside the named sizes.

torch and transformers are imported inside :func:`start_checkpoint`: importing this module stays light.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from vlrl.models.build import InitScheme

CurriculumModel = Literal["tiny", "small"]

SMALL: dict[str, Any] = {
    "hidden": 256,
    "intermediate": 768,
    "layers": 4,
    "heads": 4,
    "kv_heads": 2,
    "vision_depth": 4,
    "vision_hidden": 128,
    "vision_intermediate": 384,
    "vision_heads": 4,
}
"""A size between ``tiny`` (hidden 64, 2 layers, 2-block vision tower of width 64) and ``2b``, kept here
rather than in ``vlrl.models.archs.SIZES`` (the config's ``model.size`` choices and their goldens stay as
they are): runs use it through ``model.path``."""

SMALL_WINDOW = 224
"""The small model's vision window in px (vlrl's sizes use Qwen2.5-VL's 112). Every maze frame fits one
224 px window after the processor's resize (at most 224 x 224 px), so the windowed blocks attend over the
whole frame: a 140 px frame (5x5 at 28 px tiles, 5 x 5 merged tokens) would otherwise split into 4 windows,
and transformers runs SDPA once per window outside flash attention (4x the kernel launches per image)."""


ImageStats = Literal["model", "maze"]

MAZE_IMAGE_STATS = ((0.78, 0.76, 0.76), (0.17, 0.19, 0.19))
"""Per-channel mean and std of maze frames (64 per level: 5x5 0.75/0.71/0.72 ± 0.16/0.21/0.21 … hard
0.80/0.79/0.79 ± 0.17/0.18/0.18), for ``image_stats="maze"``. With the CLIP constants of Qwen2.5-VL's processor a
uniform wall patch (169 gray) and a floor patch (white) normalise to vectors at cosine 0.996, and Qwen3-VL's 0.5 / 0.5
makes them exactly parallel, so after the bias-free patch embedding (Qwen2.5-VL) and the vision blocks' RMSNorm the
two look alike; with these statistics they point opposite ways (cosine -0.98), as a from-scratch model's dataset
normalisation would have them."""


def checkpoint_choices(model_dir: str | Path) -> dict[str, Any]:
    """What a model directory was drawn as: ``model``, ``init`` (from its ``vlrl_model.json``; None where it does not
    say) and ``image_stats`` (from its processor config, which the renderer applies: ``maze`` where the statistics
    are :data:`MAZE_IMAGE_STATS`). A level continued from weights keeps what the first level drew."""
    path = Path(model_dir)
    built = json.loads((path / "vlrl_model.json").read_text()) if (path / "vlrl_model.json").exists() else {}
    proc = json.loads((path / "processor_config.json").read_text()) if (path / "processor_config.json").exists() else {}
    proc = proc.get("image_processor", proc)
    stats = (tuple(proc.get("image_mean", ())), tuple(proc.get("image_std", ())))
    return {
        "model": built.get("size", "").removeprefix("maze_") or None,
        "init": built.get("init"),
        "image_stats": "maze" if stats == MAZE_IMAGE_STATS else "model",
    }


def _manifest(
    arch: str, model: str, init: str, seed: int, n_params: int, image_side: int | None, image_stats: str
) -> dict[str, Any]:
    """``vlrl_model.json`` of a start checkpoint: what built it, and how (:func:`checkpoint_choices` reads it back)."""
    manifest = {"arch": arch, "size": f"maze_{model}", "init": init, "seed": seed, "n_params": n_params}
    if model == "small":
        manifest["window"] = SMALL_WINDOW
    if image_side:
        manifest["image_side"] = image_side
    if image_stats == "maze":
        manifest["image_stats"] = image_stats
    return manifest | {"builder": __name__}


def start_checkpoint(
    arch: str = "qwen2_5_vl",
    model: CurriculumModel = "small",
    init: InitScheme = "normal",
    seed: int = 0,
    image_side: int | None = None,
    image_stats: ImageStats = "model",
) -> Path:
    """The random-init ``model`` (``tiny`` or :data:`SMALL`, with tiny's tokenizer and image processor) drawn by
    the ``init`` scheme (:data:`vlrl.models.build.InitScheme`), built once into the vlrl cache the way
    ``vlrl.models.build`` builds the named sizes (weights drawn per parameter name).

    ``image_side``: the processor keeps frames up to that many px a side at their size (tiny's processor resizes
    anything over 224 x 224 down to that area). With ``data.extras.tile`` equal to the merged vision token (28 px
    for Qwen2.5-VL, 32 for Qwen3-VL) and a side that fits the level, every tile is exactly one token: easy's
    9 x 9 tiles at 25 px were resized to 224 px, 7 x 7 Qwen3-VL tokens. The weights do not depend on it.

    ``image_stats``: the processor normalises pixels with the architecture's constants (``model``) or with the maze
    frames' own statistics (``maze``, :data:`MAZE_IMAGE_STATS`); the renderer, and so every engine and the trainer,
    read them from the checkpoint's processor config."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

    from vlrl.models.archs import SIZES, config_dict
    from vlrl.models.build import build_processor, default_cache_root, init_weights_
    from vlrl.models.tokenizer import MODEL_VOCAB_SIZE, special_tokens

    if model not in ("tiny", "small"):
        raise ValueError(f"unknown curriculum model {model!r}; expected 'tiny' or 'small'")
    if image_stats not in get_args(ImageStats):
        raise ValueError(f"image_stats must be 'model' or 'maze', got {image_stats!r}")
    name = f"{arch}-maze_{model}" + (f"-w{SMALL_WINDOW}" if model == "small" else "")
    name += (f"-px{image_side}" if image_side else "") + ("-mazenorm" if image_stats == "maze" else "")
    path = default_cache_root() / "models" / (name + ("-fan_in" if init == "fan_in" else "") + f"-seed{seed}")
    if (path / "vlrl_model.json").exists():
        return path
    size = dataclasses.replace(SIZES["tiny"], **(SMALL if model == "small" else {}))
    ids = special_tokens(arch)
    torch.manual_seed(seed)
    config = config_dict(arch, size, MODEL_VOCAB_SIZE, ids)
    if arch == "qwen2_5_vl" and model == "small":
        config["vision_config"]["window_size"] = SMALL_WINDOW
    net = AutoModelForImageTextToText.from_config(AutoConfig.for_model(**config), dtype=torch.float32)
    init_weights_(net, seed, size.init_std, init)
    net.tie_weights()
    net.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # written aside, then renamed: never half-built
    net.save_pretrained(tmp)
    processor = build_processor(arch, "tiny", image_side)
    if image_stats == "maze":
        for proc in (processor.image_processor, processor.video_processor):
            proc.image_mean, proc.image_std = (list(v) for v in MAZE_IMAGE_STATS)
    processor.save_pretrained(tmp)
    n_params = sum(p.numel() for p in net.parameters())
    manifest = _manifest(arch, model, init, seed, n_params, image_side, image_stats)
    (tmp / "vlrl_model.json").write_text(json.dumps(manifest) + "\n")
    return _publish(tmp, path)


def _publish(tmp: Path, path: Path) -> Path:
    """``tmp``, a whole model directory, renamed to ``path`` unless another process built ``path`` meanwhile."""
    if (path / "vlrl_model.json").exists():
        shutil.rmtree(tmp)
    else:
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    return path


def grow_text_layers(src: str | Path, dst: str | Path, layers: int) -> Path:
    """A copy of the model directory ``src`` at ``dst`` with its language model deepened to ``layers`` decoder
    layers: after each of its N layers come copies of that layer (spread evenly, the first layers taking the
    remainder) with their attention output and MLP down projections zeroed. A zeroed copy adds nothing to the
    residual stream, so the grown model computes what ``src`` computes, logit for logit; those two projections get
    gradients from the first step, and the rest of each copy after them (LLaMA Pro's block expansion). Why: the
    small model's errors at hard's forks grow with how far it must look ahead (docs/maze.md item 31), and depth is
    cheap here (a layer is 0.8 M weights beside the 39 M of the 151,936-row embedding and its tied head).

    ``src`` must hold one ``model.safetensors`` (the curriculum's weights do). ``dst`` is written aside and then
    renamed, so it is never half-built; its ``vlrl_model.json`` says ``text_layers`` and ``grown_from``."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    text = config.get("text_config", config)
    have = int(text["num_hidden_layers"])
    if not (src / "model.safetensors").exists():
        raise ValueError(f"{src} has no single model.safetensors to grow (sharded weights are not supported)")
    if layers < have:
        raise ValueError(f"cannot grow {src} from {have} to {layers} text layers: that is fewer")
    extra, plan = layers - have, []  # (source layer, zeroed) per new layer
    for j in range(have):
        plan += [(j, False)] + [(j, True)] * (extra // have + (j < extra % have))
    tensors, out = load_file(src / "model.safetensors"), {}
    for key, value in tensors.items():
        if not key.startswith("model.layers."):
            out[key] = value
    zeroed = ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias")
    added = 0
    for i, (j, zero) in enumerate(plan):
        prefix = f"model.layers.{j}."
        for key, value in tensors.items():
            if key.startswith(prefix):
                name = key.removeprefix(prefix)
                out[f"model.layers.{i}.{name}"] = value.clone().zero_() if zero and name in zeroed else value.clone()
                added += value.numel() if zero else 0
    text["num_hidden_layers"] = layers
    if "layer_types" in text:
        text["layer_types"] = [text["layer_types"][j] for j, _ in plan]
    tmp = dst.with_name(f"{dst.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("model.safetensors", "config.json", "vlrl_model.json"))
    save_file(out, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    manifest = json.loads((src / "vlrl_model.json").read_text()) if (src / "vlrl_model.json").exists() else {}
    grown = {"n_params": manifest.get("n_params", 0) + added, "text_layers": layers, "grown_from": have}
    (tmp / "vlrl_model.json").write_text(json.dumps(manifest | grown) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst
