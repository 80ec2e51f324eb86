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


@pytest.mark.parametrize("tile", [2.5, 3, True, "28"])
def test_a_bad_tile_is_one_clear_error(tile):
    with pytest.raises(EnvError, match=r"tile must be an int of at least 4") as err:
        make_maze2d("5x5", {"tile": tile}, 0)
    assert "\n" not in str(err.value)
