"""The GPU recipes parse on any machine (the GPU training runs themselves are in tests/gpu/)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("recipe", ["maze2d", "geometry"])
def test_gpu_recipes_load(recipe):  # no GPU needed to parse them: part of the default run
    from vlrl.train.config import load_config

    cfg = load_config(recipe)
    assert cfg.model.device == "cuda" and cfg.model.dtype == "bfloat16"  # GPU recipes run bf16 by default
