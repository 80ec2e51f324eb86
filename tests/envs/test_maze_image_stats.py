"""The curriculum's random-init models with the maze frames' own pixel statistics (``image_stats="maze"``).

Qwen2.5-VL's CLIP constants normalise a uniform wall patch (gray 169) and a floor patch (white) to nearly parallel
vectors (cosine 0.996), and Qwen3-VL's 0.5 / 0.5 to exactly parallel ones: after a bias-free patch embedding and
RMSNorm the two look alike. With the frames' own statistics they differ in sign. What must hold: the stated
statistics are the frames', the renderer (the one place pixels become tensors) applies them, and the weights are the
same as with the architecture's constants, so the option changes the normalisation alone.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from vlrl.envs.maze2d import FLOOR, WALL
from vlrl.envs.maze_models import MAZE_IMAGE_STATS, checkpoint_choices, start_checkpoint
from vlrl.envs.maze_text import make_maze2d


def test_the_stated_statistics_are_the_maze_frames_own():
    frames = []
    for level in ("5x5", "7x7", "easy", "hard"):
        for seed in range(16):
            env = make_maze2d(level, {}, seed)
            frame, _ = env.gym_env.reset(seed=seed)
            frames.append(np.asarray(frame, dtype=np.float64).reshape(-1, 3) / 255)
    pooled = [np.concatenate([f for f in frames[k * 16 : (k + 1) * 16]]) for k in range(4)]  # one per level
    mean = np.mean([p.mean(0) for p in pooled], axis=0)
    std = np.mean([p.std(0) for p in pooled], axis=0)
    np.testing.assert_allclose(MAZE_IMAGE_STATS[0], mean, atol=0.02)
    np.testing.assert_allclose(MAZE_IMAGE_STATS[1], std, atol=0.02)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_the_renderer_gives_walls_and_floor_opposite_signs_with_maze_stats_only(arch):
    from vlrl.render.embedded import EmbeddedRenderer

    def means(path) -> dict[str, float]:
        renderer = EmbeddedRenderer.from_pretrained(path)
        out = {}
        for name, colour in (("wall", WALL), ("floor", FLOOR)):
            image = np.full((56, 56, 3), colour, dtype=np.uint8)
            msgs = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "?"}]}]
            out[name] = float(renderer.render(msgs).pixel_values.mean())
        return out

    model = means(start_checkpoint(arch, "tiny", "fan_in"))
    maze = means(start_checkpoint(arch, "tiny", "fan_in", image_stats="maze"))
    assert model["wall"] > 0 and model["floor"] > 0, model  # the architecture's constants: one sign
    assert maze["wall"] < 0 < maze["floor"], maze


def test_maze_stats_change_the_normalisation_alone():
    def digest(path) -> str:
        return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()

    model, maze = (
        start_checkpoint("qwen2_5_vl", "tiny", "fan_in"),
        start_checkpoint("qwen2_5_vl", "tiny", "fan_in", image_stats="maze"),
    )
    assert model != maze and digest(model) == digest(maze)


def test_a_checkpoint_says_what_it_was_drawn_as_after_a_level_saved_it(tmp_path):
    """A level continued from weights records the statistics the renderer applies, not its plan's default: the
    directory a level saves (the source's files, new weights) keeps the processor and the manifest."""
    import shutil

    maze = start_checkpoint("qwen2_5_vl", "tiny", "fan_in", image_stats="maze")
    saved = shutil.copytree(maze, tmp_path / "weights", ignore=shutil.ignore_patterns("*.safetensors"))
    assert checkpoint_choices(saved) == {"model": "tiny", "init": "fan_in", "image_stats": "maze"}
    clip = start_checkpoint("qwen2_5_vl", "tiny", "normal")
    assert checkpoint_choices(clip) == {"model": "tiny", "init": "normal", "image_stats": "model"}


def test_image_stats_must_be_model_or_maze():
    with pytest.raises(ValueError, match="image_stats must be 'model' or 'maze', got 'imagenet'"):
        start_checkpoint("qwen2_5_vl", "tiny", "fan_in", image_stats="imagenet")  # type: ignore[arg-type]
