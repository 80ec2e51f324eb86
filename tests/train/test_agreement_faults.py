"""Harness tests of the harness: a correct trainer agrees with the rollout; each deliberate fault
(temperature on one side, another trajectory's images, positions without the grid, a shifted loss
mask) makes ``assert_logprobs_agree`` fail."""

from __future__ import annotations

import pytest
import torch
import traj_helpers as H

import vlrl.train.forward as forward_mod
from pytest_vlrl import assert_logprobs_agree
from vlrl.train.batch import Batch, CollateSpec, collate
from vlrl.train.forward import policy_forward


def _batch(single_turn, arch, temperature) -> tuple[object, Batch]:
    b, trajs, gens = single_turn(arch, temperature)
    return b, collate(trajs, CollateSpec.from_model(b.model), top_logprobs=[g.top_logprobs for g in gens])


def _trainer(model, batch):
    with torch.no_grad():
        return policy_forward(model, batch, probe=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_correct_trainer_agrees_including_the_full_distribution(single_turn, arch, temperature):
    b, batch = _batch(single_turn, arch, temperature)
    report = assert_logprobs_agree(batch, _trainer(b.model, batch), tokenizer=b.tokenizer)
    assert report.distribution is not None and report.distribution.n_positions == int(batch.loss_mask.sum())
    assert report.distribution.k == 5 and report.distribution.topk_overlap_min == 1.0


def test_multi_turn_rollouts_agree_per_turn(multi_turn, arch):
    b, trajs = multi_turn(arch)
    batch = collate(trajs, CollateSpec.from_model(b.model))
    report = assert_logprobs_agree(batch, _trainer(b.model, batch))
    assert [t.turn for t in report.turns] == [0, 1, 2]


@pytest.mark.parametrize("side", ["trainer_forgets_T", "trainer_adds_T"])
def test_fault_temperature_on_one_side_only(single_turn, arch, side):
    sampled, trainer_t = (0.7, 1.0) if side == "trainer_forgets_T" else (1.0, 0.7)
    b, batch = _batch(single_turn, arch, sampled)
    faulty = batch.replace(temperature=trainer_t)
    with pytest.raises(AssertionError, match="disagree"):
        assert_logprobs_agree(batch, _trainer(b.model, faulty))


def _swap_images(batch: Batch, r1: int, r2: int) -> Batch:
    """``pixel_values`` with the patch rows of rows r1 and r2 exchanged (their grids are equal)."""
    counts = batch.image_counts.tolist()
    patches = batch.image_grid_thw.prod(-1).tolist()
    first = [sum(counts[:r]) for r in range(len(counts))]
    ranges = {}
    for r in (r1, r2):
        start = sum(patches[: first[r]])
        ranges[r] = (start, start + sum(patches[first[r] : first[r] + counts[r]]))
    assert ranges[r1][1] - ranges[r1][0] == ranges[r2][1] - ranges[r2][0], "needs same-size images"
    pix = batch.pixel_values.clone()
    (a0, a1), (b0, b1) = ranges[r1], ranges[r2]
    pix[a0:a1], pix[b0:b1] = batch.pixel_values[b0:b1], batch.pixel_values[a0:a1]
    return batch.replace(pixel_values=pix)


def test_fault_vision_tensors_of_another_trajectory(single_turn, arch):
    b, batch = _batch(single_turn, arch, 0.7)
    faulty = _swap_images(batch, 3, 4)  # the two same-size single-image rows
    with pytest.raises(AssertionError, match="disagree") as info:
        assert_logprobs_agree(batch, _trainer(b.model, faulty))
    assert "trajectory t3" in str(info.value) or "trajectory t4" in str(info.value)


def test_fault_vision_tensors_of_another_episode_multi_turn(multi_turn, arch):
    b, trajs = multi_turn(arch)
    batch = collate(trajs, CollateSpec.from_model(b.model))
    faulty = _swap_images(batch, 0, 2)  # two maze episodes of different seeds, same frame sizes
    with pytest.raises(AssertionError, match="disagree"):
        assert_logprobs_agree(batch, _trainer(b.model, faulty))


def test_fault_positions_computed_without_the_image_grid(single_turn, arch, monkeypatch):
    b, batch = _batch(single_turn, arch, 0.7)

    def text_positions(model, ids, mask, grid):  # 1-D positions on all three axes: what ignoring the grid gives
        return (mask.long().cumsum(-1) - 1).clamp(min=0)[None].expand(3, -1, -1)

    monkeypatch.setattr(forward_mod, "mrope_positions", text_positions)
    with pytest.raises(AssertionError, match="disagree") as info:
        assert_logprobs_agree(batch, _trainer(b.model, batch))
    assert "trajectory t2" not in str(info.value).split("worst positions")[1].splitlines()[1]  # text row unaffected


@pytest.mark.parametrize("variant", ["mask_only", "mask_and_logprobs"])
def test_fault_loss_mask_shifted_by_one_token(single_turn, arch, variant):
    b, batch = _batch(single_turn, arch, 0.7)
    shifted = {"loss_mask": torch.roll(batch.loss_mask, 1, dims=1)}
    if variant == "mask_and_logprobs":  # collation writes mask and logprobs one token late
        shifted["rollout_logprobs"] = torch.roll(batch.rollout_logprobs, 1, dims=1)
    faulty = batch.replace(**shifted, engine_topk=None)
    with pytest.raises(AssertionError, match="disagree"):
        assert_logprobs_agree(faulty, _trainer(b.model, faulty))


def test_fault_loss_mask_shift_in_multi_turn(multi_turn):
    b, trajs = multi_turn("qwen2_5_vl")
    batch = collate(trajs, CollateSpec.from_model(b.model))
    faulty = batch.replace(loss_mask=torch.roll(batch.loss_mask, -1, dims=1))
    with pytest.raises(AssertionError, match="disagree"):
        assert_logprobs_agree(faulty, _trainer(b.model, faulty))


def test_bf16_agrees_within_bf16_bounds_but_not_fp32_bounds(tiny):
    from vlrl.engines.embedded import EmbeddedEngine

    b = tiny("qwen2_5_vl")
    engine = EmbeddedEngine.from_pretrained(b.path, dtype=torch.bfloat16)

    class Bf16:
        renderer, model = b.renderer, engine.model

    Bf16.engine = engine
    trajs, gens = H.rollout(Bf16, list(H.conversations().values()), 0.7, topk=5, max_tokens=16)
    batch = collate(trajs, CollateSpec.from_model(engine.model), top_logprobs=[g.top_logprobs for g in gens])
    out = _trainer(engine.model, batch)
    assert out.logprobs.dtype == torch.float32
    report = assert_logprobs_agree(batch, out, dtype=engine.model.dtype)
    assert report.overall.max_abs > 1e-6  # bf16 really differs a little
    with pytest.raises(AssertionError, match="disagree"):
        assert_logprobs_agree(batch, out, dtype=torch.float32)
