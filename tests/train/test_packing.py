"""Sample packing: packed and padded rows give the same logprobs (fp32 bound) and gradients; faults show."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from vlrl.algos.config import AlgoConfig
from vlrl.checks.agreement import compare_logprobs
from vlrl.models import attention
from vlrl.models.load import load_model
from vlrl.models.positions import mrope_positions
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


def test_packed_sequence_has_no_padding_row_local_positions_and_runs_varlen(single_turn, multi_turn, monkeypatch):
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")
    packed = pack_rows(b.model, batch)
    calls = []
    real = attention.varlen_sdpa
    monkeypatch.setattr(
        attention, "varlen_sdpa", lambda q, k, v, lengths, *a: calls.append(lengths) or real(q, k, v, lengths, *a)
    )
    with torch.no_grad():
        packing.packed_forward(b.model, packed)
    assert calls == [packed.lengths] * b.model.config.text_config.num_hidden_layers
    assert packed.lengths == tuple(batch.seq_lens.tolist())
    lens = batch.seq_lens.tolist()
    assert packed.num_tokens == sum(lens) < batch.input_ids.numel()
    text = packed.position_ids[0, 0]  # resets to 0 at every row start
    starts = torch.tensor([0, *torch.tensor(lens).cumsum(0)[:-1].tolist()])
    assert torch.equal((text == 0).nonzero()[:, 0], starts)
    assert torch.equal(
        unpack(packed, packed.input_ids[..., None])[..., 0] * batch.attention_mask,
        batch.input_ids * batch.attention_mask,
    )
    for row, (start, n) in enumerate(zip(starts.tolist(), lens, strict=True)):  # each row alone, from its origin
        alone = batch.select([row])
        own = mrope_positions(b.model, alone.input_ids, alone.attention_mask, alone.image_grid_thw)[:, 0]
        assert torch.equal(packed.position_ids[1:, 0, start : start + n], own), f"row {row}"


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


def test_transformers_mask_path_agrees_too(single_turn, multi_turn, monkeypatch):
    """Without vlrl's varlen attention: position-id resets -> transformers' block-diagonal mask."""
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")
    monkeypatch.setattr(packing, "packed_forward", functools.partial(packing.packed_forward, varlen=False))
    monkeypatch.setattr(attention, "varlen_sdpa", None)  # would raise if the varlen path were taken
    with torch.no_grad():
        plain = policy_forward(b.model, batch)
        packed = policy_forward(b.model, batch, packing=True)
    report = _agree(plain.logprobs, packed.logprobs, batch)
    assert not report.breached, report.breaches


FAULTS = {
    "varlen_one_segment": lambda p: dataclasses.replace(p, lengths=(p.num_tokens,)),
    "mask_no_position_resets": lambda p: dataclasses.replace(
        p, position_ids=torch.cat([torch.arange(p.num_tokens).view(1, 1, -1), p.position_ids[1:]])
    ),
    "positions_without_grid": lambda p: dataclasses.replace(
        p, position_ids=torch.cat([p.position_ids[:1], p.cols.view(1, 1, -1).expand(3, 1, -1)])
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_packing_faults_breach_the_bound(single_turn, multi_turn, fault, monkeypatch):
    """The check has teeth: attention that sees earlier rows (varlen or mask path), or mRoPE ids without
    the image grids. (Row positions shifted by a constant are no fault: RoPE sees differences only.)"""
    b, batch = _mixed_batch(single_turn, multi_turn, "qwen2_5_vl")
    monkeypatch.setattr(packing, "pack_rows", lambda model, batch: FAULTS[fault](pack_rows(model, batch)))
    if fault.startswith("mask"):
        monkeypatch.setattr(packing, "packed_forward", functools.partial(packing.packed_forward, varlen=False))
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
