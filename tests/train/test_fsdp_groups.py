"""FSDP2's groups of blocks: consecutive blocks of one tower, about a fixed fraction of the model each."""

from __future__ import annotations

import pytest
import torch
import transformers

from vlrl.models.build import build_config
from vlrl.train.fsdp import GROUP_FRACTION, block_groups, towers


def meta_model(size: str):
    with torch.device("meta"):
        return transformers.Qwen2_5_VLForConditionalGeneration(build_config("qwen2_5_vl", size))


def numel(modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


@pytest.mark.parametrize("size", ["tiny", "2b"])
def test_groups_cover_each_tower_in_order_and_never_mix_towers(size):
    model = meta_model(size)
    groups = block_groups(model)
    flat = [block for group in groups for block in group]
    assert flat == [block for tower in towers(model) for block in tower]
    tower_of = {id(b): i for i, tower in enumerate(towers(model)) for b in tower}
    assert all(len({tower_of[id(b)] for b in group}) == 1 for group in groups)


def test_the_2b_models_groups_are_about_a_sixteenth_of_it():
    model = meta_model("2b")
    groups = block_groups(model)
    total = numel([model])
    # 14 groups instead of a group per block (60): FSDP's per-group hooks run 4x less often
    assert 10 <= len(groups) <= 16
    assert all(numel(g) <= 1.5 * GROUP_FRACTION * total for g in groups)
    assert [len(g) for g in block_groups(model, 0)] == [1] * 60
