"""Build random-init Qwen-VL checkpoints offline: config, weights, tokenizer, processor.

A checkpoint directory written here loads with ``AutoProcessor`` / ``AutoModelForImageTextToText``
(and with vLLM) exactly as a downloaded one does. Weights are deterministic from the seed: every
parameter draws from its own generator seeded by ``(seed, parameter name)``, so the result does not
depend on module construction order or on the transformers version's init code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from vlrl.models.archs import ARCHS, SIZES, config_dict, image_processor_kwargs
from vlrl.models.chat_template import chat_template
from vlrl.models.tokenizer import MODEL_VOCAB_SIZE, build_tokenizer, special_tokens

MANIFEST = "vlrl_model.json"
_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
_VIDEO_PROCESSORS = {
    "qwen2_vl": "Qwen2VLVideoProcessor",
    "qwen2_5_vl": "Qwen2VLVideoProcessor",
    "qwen3_vl": "Qwen3VLVideoProcessor",
}


def _check(arch: str, size: str) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; expected one of {list(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {list(SIZES)}")


def build_config(arch: str, size: str):
    """The transformers config object for ``arch`` at the named ``size``."""
    from transformers import AutoConfig

    _check(arch, size)
    cfg = config_dict(arch, SIZES[size], MODEL_VOCAB_SIZE, special_tokens(arch))
    return AutoConfig.for_model(**cfg)


def build_processor(arch: str, size: str, max_side: int | None = None):
    """Tokenizer (real Qwen vocabulary, vlrl's chat template) + torchvision image processor + video processor.

    ``max_side``: images up to ``max_side`` x ``max_side`` px keep their size (rounded to the vision token);
    larger ones are resized down to that area (default: the size's ``max_pixels``)."""
    import transformers

    _check(arch, size)
    template = chat_template()
    tokenizer = build_tokenizer(arch, template)
    spec = SIZES[size] if max_side is None else dataclasses.replace(SIZES[size], max_pixels=max_side * max_side)
    ip = image_processor_kwargs(arch, spec)
    image_processor = transformers.Qwen2VLImageProcessor(**ip)
    video_processor = getattr(transformers, _VIDEO_PROCESSORS[arch])(
        patch_size=ip["patch_size"],
        temporal_patch_size=2,
        merge_size=2,
        image_mean=ip["image_mean"],
        image_std=ip["image_std"],
    )
    processor_cls = getattr(transformers, _PROCESSORS[arch])
    return processor_cls(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor, chat_template=template
    )


InitScheme = Literal["normal", "fan_in"]
"""How :func:`init_weights_` draws the weight matrices: ``normal`` N(0, std) everywhere (the named sizes, as
transformers' ``initializer_range``); ``fan_in`` N(0, 1 / fan_in) for every matrix but the embedding tables (token
and vision position embeddings keep N(0, std)), so each layer keeps its input's scale whatever the width."""

_EMBEDDING_TABLES = ("embed_tokens.weight", "pos_embed.weight", "lm_head.weight")


def init_weights_(model, seed: int, std: float, scheme: InitScheme = "normal") -> None:
    """Re-draw every ≥2-D parameter with a generator per (seed, name) (``scheme``: see :data:`InitScheme`);
    1-D parameters keep transformers' init (norm weights 1, biases 0), which is deterministic.

    Why ``fan_in`` exists: std 0.02 suits widths near 2,500 (1 / sqrt(2500)); at vlrl's ``tiny`` width of 64 each
    matrix scales its input by about 0.02 * sqrt(64) = 0.16. Trained as SFT trains a maze policy (the reply over
    the whole vocabulary), the tiny model drawn so kept its first move at chance (direction cross-entropy 1.35 after
    400 steps, ln 4 = 1.39; its vision tower's gradient fell to ~1e-3) where drawn by ``fan_in`` it learned it
    (0.23, held-out 83 %): benchmarks/results/maze_reply_probe_cpu.json, docs/maze.md."""
    import torch

    if scheme not in ("normal", "fan_in"):
        raise ValueError(f"unknown init scheme {scheme!r}; expected 'normal' or 'fan_in'")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim < 2:
                continue
            digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
            gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little"))
            scale = std
            if scheme == "fan_in" and not name.endswith(_EMBEDDING_TABLES):
                scale = param[0].numel() ** -0.5  # [out, in, *kernel]: fan-in = in * kernel
            values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * scale
            param.copy_(values.to(param.dtype))


def build_model(arch: str, size: str, seed: int = 0, dtype=None, device: str = "cpu"):
    """A random-init ``*ForConditionalGeneration`` model in memory (fp32 unless ``dtype``)."""
    import torch
    from transformers import AutoModelForImageTextToText

    config = build_config(arch, size)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    init_weights_(model, seed, SIZES[size].init_std)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model.to(device=device, dtype=dtype or torch.float32).eval()


def write_checkpoint(out: str | os.PathLike, arch: str, size: str = "tiny", seed: int = 0) -> Path:
    """Write a complete checkpoint directory and return its path."""
    from transformers import GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(arch, size, seed)
    ids = special_tokens(arch)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    model.save_pretrained(out)
    build_processor(arch, size).save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    manifest = {"arch": arch, "size": size, "seed": seed, "n_params": n_params, "builder": "vlrl.models.build"}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def default_cache_root() -> Path:
    return Path(os.environ.get("VLRL_CACHE") or Path.home() / ".cache" / "vlrl")


def cached_model_dir(arch: str, size: str = "tiny", seed: int = 0, cache_root: str | os.PathLike | None = None) -> Path:
    """The checkpoint for (arch, size, seed) under the cache, built on first use.

    A directory counts as built only once its manifest exists (written last), so an interrupted
    build is redone rather than loaded half-written.
    """
    _check(arch, size)
    root = Path(cache_root) if cache_root else default_cache_root()
    path = root / "models" / f"{arch}-{size}-seed{seed}"
    if not (path / MANIFEST).exists():
        import shutil

        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        write_checkpoint(tmp, arch, size, seed)
        # Several processes may build at once (the ranks of a torchrun on a fresh cache): the first rename
        # wins and the others drop their copy, never deleting a built directory that another one may be loading.
        if not (path / MANIFEST).exists() and path.exists():
            shutil.rmtree(path, ignore_errors=True)  # an interrupted build from before manifests came last
        try:
            tmp.rename(path)
        except OSError:
            if not (path / MANIFEST).exists():
                raise
            shutil.rmtree(tmp)
    return path
