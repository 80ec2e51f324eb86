"""Trajectories → Batch: alignment of every per-token tensor, vision tensors in order, integrity errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vlrl.train.batch import BatchIntegrityError, CollateSpec, collate


def _batch(single_turn, arch="qwen2_5_vl", T=1.0, **kw):
    b, trajs, gens = single_turn(arch, T)
    return b, trajs, gens, collate(trajs, CollateSpec.from_model(b.model), **kw)


def test_every_per_token_tensor_is_aligned_with_the_tokens(single_turn):
    b, trajs, gens, batch = _batch(single_turn)
    B, L = batch.input_ids.shape
    assert B == len(trajs) and L == max(len(t.token_ids) for t in trajs)
    for row, (t, g) in enumerate(zip(trajs, gens)):
        n, p = len(t.token_ids), len(t.prompt_ids)
        assert batch.input_ids[row, :n].tolist() == list(t.token_ids)
        assert (batch.input_ids[row, n:] == CollateSpec.from_model(b.model).pad_id).all()  # right padding
        assert batch.attention_mask[row].tolist() == [1] * n + [0] * (L - n)
        assert batch.loss_mask[row].tolist() == [0.0] * p + [1.0] * (n - p) + [0.0] * (L - n)
        assert batch.input_ids[row, p:n].tolist() == list(g.token_ids)  # mask 1 exactly on the engine's tokens
        assert torch.equal(batch.rollout_logprobs[row, p:n], torch.tensor(g.logprobs, dtype=torch.float32))
        assert batch.rollout_logprobs[row, :p].abs().sum() == 0 and batch.rollout_logprobs[row, n:].abs().sum() == 0
        assert batch.rewards[row].nonzero().flatten().tolist() == [n - 1]
        assert batch.turn_index[row].tolist() == [0] * n + [-1] * (L - n)
    assert batch.uids == tuple(t.uid for t in trajs) and batch.groups.tolist() == [t.group for t in trajs]
    assert batch.temperature == 1.0


def test_vision_tensors_are_concatenated_in_trajectory_order(single_turn):
    _, trajs, _, batch = _batch(single_turn)
    with_images = [t for t in trajs if t.n_images]
    assert torch.equal(batch.pixel_values, torch.cat([t.pixel_values for t in with_images]))
    assert torch.equal(batch.image_grid_thw, torch.cat([t.image_grid_thw for t in with_images]))
    assert batch.image_counts.tolist() == [t.n_images for t in trajs] == [1, 3, 0, 1, 1]


def test_micro_batches_carry_their_own_vision_tensors(single_turn):
    _, trajs, _, batch = _batch(single_turn)
    for rows in ([2], [1, 3], [4, 0], [0]):
        sub = batch.select(rows)
        imgs = [trajs[r] for r in rows if trajs[r].n_images]
        if imgs:
            assert torch.equal(sub.pixel_values, torch.cat([t.pixel_values for t in imgs]))
            assert torch.equal(sub.image_grid_thw, torch.cat([t.image_grid_thw for t in imgs]))
        else:
            assert sub.pixel_values is None and sub.image_grid_thw is None
        width = max(len(trajs[r].token_ids) for r in rows)
        assert sub.input_ids.shape == (len(rows), width)
        assert sub.uids == tuple(trajs[r].uid for r in rows)
    assert [s.uids for s in batch.split(2)] == [("t0", "t1"), ("t2", "t3"), ("t4",)]


def test_engine_top_logprobs_are_placed_at_generated_positions(single_turn):
    _, trajs, gens, batch = _batch(
        single_turn, top_logprobs=[g.top_logprobs for g in single_turn("qwen2_5_vl", 1.0)[2]]
    )
    top = batch.engine_topk
    assert top is not None and top.k == 5 and len(top) == sum(len(g.token_ids) for g in gens)
    for j in (0, len(top) - 1):
        row, pos = int(top.rows[j]), int(top.positions[j])
        i = pos - len(trajs[row].prompt_ids)
        assert top.ids[j].tolist() == [p[0] for p in gens[row].top_logprobs[i]]
    sub = batch.select([3])
    assert set(sub.engine_topk.rows.tolist()) == {0} and len(sub.engine_topk) == len(gens[3].token_ids)


def test_mixed_temperatures_are_refused_by_name(single_turn):
    b, trajs, _ = single_turn("qwen2_5_vl", 1.0)
    hot = dataclasses.replace(trajs[1], uid="hot", temperature=0.7)
    with pytest.raises(BatchIntegrityError, match="share a temperature.*hot"):
        collate([trajs[0], hot], CollateSpec.from_model(b.model))


def test_pad_token_count_must_match_the_grids(single_turn):
    b, trajs, _ = single_turn("qwen2_5_vl", 1.0)
    t = trajs[0]
    ph = t.placeholders[0]
    ids = list(t.prompt_ids)
    ids[ph.offset + ph.length - 1] = ids[ph.offset - 1]  # one placeholder token less
    broken = dataclasses.replace(t, prompt_ids=tuple(ids))
    with pytest.raises(BatchIntegrityError, match=f"trajectory {t.uid}: image 0 grid"):
        collate([broken], CollateSpec.from_model(b.model))
    pad = CollateSpec.from_model(b.model).image_token_id
    stray = dataclasses.replace(t, prompt_ids=t.prompt_ids[:-1] + (pad,))  # an extra pad outside any image
    with pytest.raises(BatchIntegrityError, match="image pad tokens in the sequence"):
        collate([stray], CollateSpec.from_model(b.model))


def test_pixel_rows_must_match_the_grids(single_turn):
    b, trajs, _ = single_turn("qwen2_5_vl", 1.0)
    t = trajs[1]
    short = dataclasses.replace(t, pixel_values=t.pixel_values[:-4])
    with pytest.raises(BatchIntegrityError, match=f"trajectory {t.uid}: pixel_values has"):
        collate([trajs[2], short], CollateSpec.from_model(b.model))
    swapped = dataclasses.replace(t, image_grid_thw=t.image_grid_thw[:2])
    with pytest.raises(BatchIntegrityError, match="3 placeholder runs but 2 image grids"):
        collate([swapped], CollateSpec.from_model(b.model))


def test_multi_turn_trajectories_collate_with_turn_indices(multi_turn):
    b, trajs = multi_turn("qwen2_5_vl")
    batch = collate(trajs, CollateSpec.from_model(b.model))
    for row, t in enumerate(trajs):
        assert len(t.turns) == 3
        for span in t.turns:
            assert (batch.turn_index[row, span.obs_start : span.gen_end] == span.index).all()
            gen_mask = batch.loss_mask[row, span.gen_start : span.gen_end]
            assert gen_mask.sum() >= 1 and (batch.loss_mask[row, span.obs_start : span.gen_start] == 0).all()
        assert batch.loss_mask[row].sum() == sum(t.loss_mask)
    assert batch.image_counts.tolist() == [t.n_images for t in trajs]
