"""Sample packing: packed and padded rows give the same logprobs (fp32 bound) and gradients; faults show."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vlrl.algos.config import AlgoConfig
from vlrl.checks.agreement import compare_logprobs
from vlrl.models.load import load_model
from vlrl.train import packing
from vlrl.train.batch import Batch, CollateSpec, collate
from vlrl.train.config import OptimSection
from vlrl.train.forward import policy_forward
from vlrl.train.packing import pack_rows, unpack
from vlrl.train.trainer import Trainer


def _mixed_batch(single_turn, multi_turn, arch: str):
    """Multi-turn maze rows (an image every turn) + text, one-, three-image rows: all lengths differ."""
    b, multi = multi_turn(arch)
    _, single, _ = single_turn(arch, 0.7)  # the maze rollouts' temperature
    batch = collate(list(multi) + list(single), CollateSpec.from_model(b.model))
    assert len(set(batch.seq_lens.tolist())) >= 4 and batch.image_counts.max() >= 3
    assert (batch.image_counts == 0).any()
    return b, batch


def _agree(unpacked: torch.Tensor, packed: torch.Tensor, batch: Batch):
    return compare_logprobs(unpacked, packed, batch.loss_mask, turn_index=batch.turn_index, dtype="float32")


def test_packed_logprobs_match_unpacked(single_turn, multi_turn, arch):
    b, batch = _mixed_batch(single_turn, multi_turn, arch)
    with torch.no_grad():
        plain = policy_forward(b.model, batch)
        packed = policy_forward(b.model, batch, packing=True)
    report = _agree(plain.logprobs, packed.logprobs, batch)
    assert not report.breached, report.breaches
    assert report.overall.n_tokens > 100
    assert torch.equal(plain.computed, packed.computed)
    assert (packed.logprobs[~packed.computed] == 0).all()
    ent = (plain.entropy - packed.entropy)[plain.computed].abs().max().item()
    assert ent <= 1e-4, f"entropy max |Δ| {ent}"


def test_packed_sequence_has_no_padding_and_row_local_positions(single_turn, multi_turn):
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")
    packed = pack_rows(b.model, batch)
    lens = batch.seq_lens.tolist()
    assert packed.num_tokens == sum(lens) < batch.input_ids.numel()
    text = packed.position_ids[0, 0]  # resets to 0 at every row start
    starts = torch.tensor([0, *torch.tensor(lens).cumsum(0)[:-1].tolist()])
    assert torch.equal((text == 0).nonzero()[:, 0], starts)
    assert torch.equal(
        unpack(packed, packed.input_ids[..., None])[..., 0] * batch.attention_mask,
        batch.input_ids * batch.attention_mask,
    )


def test_packed_gradients_match_unpacked(single_turn, multi_turn):
    """One backward each on an own model copy: every parameter's grad within 1e-4 of its largest entry."""
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")
    model = load_model(b.path).train()
    grads = []
    for packed in (False, True):
        model.zero_grad()
        out = policy_forward(model, batch, packing=packed)
        (-(out.logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    plain, packed = grads
    assert plain.keys() == packed.keys()
    assert any(n.startswith("model.visual.") and plain[n].abs().sum() > 0 for n in plain), "no vision gradient"
    for n in plain:
        err = (plain[n] - packed[n]).abs().max().item()
        assert err <= 1e-4 * plain[n].abs().max().item() + 1e-9, f"{n}: packed vs padded grad max |Δ| {err}"


def test_trainer_with_optim_packing_gives_the_same_logprobs(single_turn, multi_turn):
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")
    lps = [
        Trainer(b.model, AlgoConfig(), OptimSection(micro_batch_size=3, packing=p)).logprobs(batch).logprobs
        for p in (False, True)
    ]
    assert not _agree(*lps, batch).breached


@pytest.mark.parametrize("fault", ["attention_crosses_rows", "positions_without_grid"])
def test_packing_faults_breach_the_bound(single_turn, multi_turn, fault, monkeypatch):
    """The check has teeth: packed attention that sees earlier rows, or mRoPE ids without the image grids.
    (Row positions shifted by a constant are no fault: RoPE only sees differences within a row.)"""
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")

    def faulty(model, batch):
        packed = pack_rows(model, batch)
        pos, run_on = packed.position_ids.clone(), torch.arange(packed.num_tokens)
        if fault == "attention_crosses_rows":
            pos[0, 0] = run_on  # no resets: one causal sequence over all rows
        else:
            pos[1:, 0] = packed.cols  # 1-D positions: the image grids ignored
        return dataclasses.replace(packed, position_ids=pos)

    monkeypatch.setattr(packing, "pack_rows", faulty)
    with torch.no_grad():
        plain = policy_forward(b.model, batch)
        bad = policy_forward(b.model, batch, packing=True)
    report = _agree(plain.logprobs, bad.logprobs, batch)
    assert report.breached, f"{fault}: max |Δ| {report.overall.max_abs} within the fp32 bound"


def test_left_padded_rows_are_refused(single_turn):
    b, trajs, _ = single_turn("qwen2_5_vl", 0.7)
    batch = collate(trajs[:2], CollateSpec.from_model(b.model))
    flipped = batch.replace(attention_mask=batch.attention_mask.flip(1), input_ids=batch.input_ids.flip(1))
    with pytest.raises(ValueError, match="right-padded"):
        pack_rows(b.model, flipped)
