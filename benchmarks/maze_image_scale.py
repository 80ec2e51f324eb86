"""The scale of a model's merged image tokens on maze frames, against its text embeddings.

    python benchmarks/maze_image_scale.py MODEL_DIR [MODEL_DIR ...] [--level 5x5] [--tile 25] [--mazes 12]

Per model directory (a checkpoint, or a run's ``weights/``): the RMS of the vision tower's merged tokens
(``get_image_features``) over the first frames of ``--mazes`` seeded mazes, the RMS of how they differ from
maze to maze, and the RMS of the text embedding rows. Behind the decoder's RMSNorm the image pathway is
scale-invariant, so image tokens that grow during training get a gradient that shrinks as 1 / their RMS.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def image_scale(path: str, level: str, tile: int, mazes: int) -> dict:
    """``{"image_rms", "between_maze_rms", "text_embed_rms"}`` of the model at ``path``."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vlrl.envs.maze_text import make_maze2d

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(path).image_processor
    tokens = []
    for seed in range(mazes):
        env = make_maze2d(level, {"tile": tile}, seed)
        frame, _ = env.gym_env.reset(seed=seed)
        inputs = processor(images=[frame], return_tensors="pt")
        with torch.no_grad():
            out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        out = getattr(out, "pooler_output", out)
        tokens.append(out[0] if isinstance(out, list | tuple) else out)  # [T, H] merged tokens of one frame
    stacked = torch.stack(tokens)  # [mazes, T, H]
    embed = model.get_input_embeddings().weight.detach()
    return {
        "model": path,
        "image_rms": round(float(stacked.pow(2).mean().sqrt()), 5),
        "between_maze_rms": round(float(stacked.std(0).pow(2).mean().sqrt()), 5),
        "text_embed_rms": round(float(embed.pow(2).mean().sqrt()), 5),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--level", default="5x5")
    ap.add_argument("--tile", type=int, default=25)
    ap.add_argument("--mazes", type=int, default=12)
    args = ap.parse_args(argv)
    for path in args.models:
        print(json.dumps(image_scale(path, args.level, args.tile, args.mazes)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
