"""maze2d's ``tile`` extra: frames drawn at another tile size, and at 28 px one merged vision token per tile."""

from __future__ import annotations

import numpy as np
import pytest

from vlrl.envs.contract import EnvError
from vlrl.envs.maze2d import AGENT, FLOOR, TARGET, WALL
from vlrl.envs.maze_text import make_maze2d


def _frame(level: str, tile: int, seed: int = 3):
    env = make_maze2d(level, {"tile": tile}, seed)
    frame, info = env.gym_env.reset(seed=seed)
    return frame, env.gym_env.unwrapped


@pytest.mark.parametrize("tile", [16, 28])
def test_each_tile_is_drawn_at_its_size_and_the_disc_keeps_a_quarter_of_it(tile):
    frame, game = _frame("7x7", tile)
    assert frame.shape == (7 * tile, 7 * tile, 3)
    colours = {0: FLOOR, 1: WALL}
    for r in range(7):
        for c in range(7):
            cell = frame[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
            if (r, c) == game.agent:
                disc = (cell == AGENT).all(axis=2)
                assert abs(int(disc.sum()) - np.pi * (tile / 4) ** 2) < 0.12 * np.pi * (tile / 4) ** 2
                assert not disc[0].any() and not disc[:, 0].any()  # inside its tile
            else:
                want = TARGET if (r, c) == game.target else colours[int(game.maze_map[r, c])]
                assert (cell == want).all(), (r, c)


def test_28px_tiles_reach_the_vision_tower_unresized_one_merged_token_per_tile():
    """Qwen2.5-VL merges 2 x 2 patches of 14 px: a 28 px tile is exactly one merged token, where the
    25 px frame is resized (125 -> 112 px: 4 x 4 tokens over 5 x 5 tiles)."""
    from vlrl.models.build import build_processor

    processor = build_processor("qwen2_5_vl", "tiny").image_processor
    for tile, grid in ((28, [1, 10, 10]), (25, [1, 8, 8])):
        frame, _ = _frame("5x5", tile)
        out = processor(images=[frame], return_tensors="pt")
        assert out["image_grid_thw"].tolist() == [grid], tile


@pytest.mark.parametrize("level,size", [("5x5", 5), ("easy", 9), ("hard", 11)])
def test_qwen3_tiles_of_32px_are_one_token_each_when_the_processor_keeps_the_frame(level, size):
    """Qwen3-VL merges 2 x 2 patches of 16 px. tiny's processor resizes easy's 225 px frame to 224 px (7 x 7
    tokens over 9 x 9 tiles); with ``max_side`` 352 a 32 px tile is exactly one token at every level."""
    from vlrl.models.build import build_processor

    wide = build_processor("qwen3_vl", "tiny", max_side=352).image_processor
    frame, _ = _frame(level, 32)
    assert wide(images=[frame], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 2 * size, 2 * size]]
    if level == "easy":
        narrow = build_processor("qwen3_vl", "tiny").image_processor
        frame, _ = _frame(level, 25)
        assert narrow(images=[frame], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 14, 14]]


def test_start_checkpoint_keeps_its_image_side_in_the_saved_processor(tmp_path, monkeypatch):
    """The curriculum's random-init model carries the side into its directory, so every level and the SFT
    workers (which load the renderer from it) see the frame at that size; the weights do not change."""
    import json

    from safetensors.torch import load_file

    from vlrl.envs.maze_models import start_checkpoint

    monkeypatch.setenv("VLRL_CACHE", str(tmp_path))
    wide = start_checkpoint("qwen3_vl", "tiny", "fan_in", image_side=352)
    plain = start_checkpoint("qwen3_vl", "tiny", "fan_in")
    assert wide != plain and "-px352" in wide.name
    from transformers import AutoProcessor

    frame, _ = _frame("easy", 32)
    loaded = AutoProcessor.from_pretrained(wide).image_processor
    assert loaded(images=[frame], return_tensors="pt")["image_grid_thw"].tolist() == [[1, 18, 18]]
    assert json.loads((wide / "vlrl_model.json").read_text())["image_side"] == 352
    a, b = load_file(wide / "model.safetensors"), load_file(plain / "model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


@pytest.mark.parametrize("tile", [2.5, 3, True, "28"])
def test_a_bad_tile_is_one_clear_error(tile):
    with pytest.raises(EnvError, match=r"tile must be an int of at least 4") as err:
        make_maze2d("5x5", {"tile": tile}, 0)
    assert "\n" not in str(err.value)
