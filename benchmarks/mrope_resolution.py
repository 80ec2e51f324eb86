"""How finely the text model's M-RoPE tells image positions apart, per arch and size (no weights needed).

    python benchmarks/mrope_resolution.py [--span 7] [--out benchmarks/results/mrope_resolution.json]

A merged image token at grid row h, column w gets text positions (t, h, w); the rotary pairs assigned to the
h (or w) axis rotate queries and keys by rate × h (× w), and attention can select an image token by where it
is only through those rotations. The script runs transformers' own text rotary embedding of each config on
position ids that move one axis at a time, and reads per axis: how many rotary pairs turn, the fastest one's
rate (rad per merged token), and the most any pair turns across ``--span`` tokens (7: a 7x7 maze with one
merged token per tile). Qwen2/2.5-VL give each axis a contiguous block of the spectrum (t the fastest, w the
slowest); Qwen3-VL interleaves the axes over it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ARCHS = ("qwen2_5_vl", "qwen3_vl")


def size_of(name: str):
    from vlrl.models.archs import SIZES

    if name == "small":
        from vlrl.envs.maze_models import SMALL

        return dataclasses.replace(SIZES["tiny"], **SMALL)
    return SIZES[name]


def rotary(arch: str, size_name: str):
    from transformers import AutoConfig

    from vlrl.models.archs import config_dict
    from vlrl.models.tokenizer import MODEL_VOCAB_SIZE, special_tokens

    config = AutoConfig.for_model(**config_dict(arch, size_of(size_name), MODEL_VOCAB_SIZE, special_tokens(arch)))
    if arch == "qwen3_vl":
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary
    else:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding as Rotary
    return Rotary(config.text_config), config.text_config


def axis_rates(rot, axis: int, span: int) -> dict:
    """Rotation of each rotary pair per step along ``axis`` (1 = h, 2 = w), the other axes held at 0."""
    import torch

    pos = torch.zeros(3, 1, span, dtype=torch.long)
    pos[axis, 0] = torch.arange(span)
    cos, sin = rot(torch.zeros(1), pos)  # [1, span, head_dim], the two halves equal
    half = cos.shape[-1] // 2
    angle = torch.atan2(sin[0, :, :half], cos[0, :, :half])  # [span, pairs]
    rate = (angle[1] - angle[0]).abs()  # rad per token; every rate < pi, so no wrap
    turning = rate > 0
    return {
        "pairs": int(turning.sum()),
        "of_pairs": half,
        "fastest_rad_per_token": float(rate.max()),
        "most_turn_across_span_rad": float((rate * (span - 1)).clamp(max=torch.pi).max()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--span", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/results/mrope_resolution.json")
    args = ap.parse_args(argv)
    rows = []
    for arch in ARCHS:
        for size_name in ("tiny", "small", "2b"):
            rot, text = rotary(arch, size_name)
            rope = dict(text.rope_parameters)
            row = {"arch": arch, "size": size_name, "head_dim": size_of(size_name).head_dim}
            row.update(rope_theta=rope["rope_theta"], mrope_section=rope["mrope_section"])
            row.update(interleaved=bool(rope.get("mrope_interleaved", False)))
            row.update(h=axis_rates(rot, 1, args.span), w=axis_rates(rot, 2, args.span))
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"what": __doc__.strip().splitlines()[0], "command": "python benchmarks/mrope_resolution.py"}
    out.update(span=args.span, rows=rows)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
