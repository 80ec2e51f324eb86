"""The pieces of a distributed step that need no second process: each rank's share of a batch, its padding,
the gathered logprobs, and the ``vlrl train --nproc`` launch."""

from __future__ import annotations

import subprocess

import pytest
import torch

from vlrl.cli import main
from vlrl.train import distributed as D
from vlrl.train.forward import ForwardOutput


@pytest.mark.parametrize("n, world", [(9, 2), (8, 2), (3, 4), (1, 2), (64, 3)])
def test_shares_are_contiguous_balanced_and_equal_in_size(n, world):
    shares = [D.share_of(n, r, world) for r in range(world)]
    own = [list(s.rows[: s.n_real]) for s in shares]
    assert [r for rows in own for r in rows] == list(range(n))  # every row once, in rank order
    assert {s.size for s in shares} == {-(-n // world)}  # FSDP: the same number of forwards on every rank
    assert max(s.n_real for s in shares) - min(s.n_real for s in shares) <= 1
    assert all(s.start == (o[0] if o else s.start) for s, o in zip(shares, own))


def test_a_padding_row_trains_nothing_and_keeps_the_real_rows_topk(single_turn):
    bundle, trajs, gens = single_turn("qwen2_5_vl", 1.0)
    batch = collate_five(bundle, trajs, gens)
    share = D.share_of(batch.size, 1, 2)
    assert share.n_real < share.size, "the case needs a padding row"
    local = D.local_batch(batch, share)
    assert local.size == share.size and float(local.loss_mask[share.n_real :].sum()) == 0
    assert torch.equal(local.input_ids[share.n_real :], local.input_ids[share.n_real - 1 : share.n_real])
    real = batch.select(share.rows[: share.n_real])
    assert torch.equal(local.engine_topk.rows, real.engine_topk.rows)  # the copy claims none of its original's


def test_gathered_logprobs_are_the_whole_batchs(single_turn):
    bundle, trajs, gens = single_turn("qwen2_5_vl", 1.0)
    batch = collate_five(bundle, trajs, gens)
    share = D.Share(rows=tuple(range(batch.size)), n_real=batch.size, start=0)  # one rank
    lp = torch.randn(batch.input_ids.shape)
    out = ForwardOutput(logprobs=lp, entropy=torch.zeros_like(lp), computed=batch.loss_mask.bool())
    assert torch.equal(D.gather_forward(out, share, batch).logprobs, lp)


def collate_five(bundle, trajs, gens):
    """Five trajectories with the engine's top-5 (two ranks: 3 + 2 rows, one padding row)."""
    from vlrl.train.batch import CollateSpec, collate

    return collate(trajs[:5], CollateSpec.from_model(bundle.model), top_logprobs=[g.top_logprobs for g in gens[:5]])


def test_vlrl_train_nproc_runs_torchrun(monkeypatch):
    calls = []
    monkeypatch.setattr(
        subprocess, "run", lambda argv, check: calls.append(argv) or subprocess.CompletedProcess(argv, 0)
    )
    assert main(["train", "--nproc", "3", "color_square", "run.steps=1", "--report"]) == 0
    argv = calls[0]
    assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    assert argv[5:] == ["-m", "vlrl", "train", "color_square", "run.steps=1", "--report"]


def test_vlrl_train_nproc_refuses_zero_and_bad_config_before_launching(monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    assert main(["train", "--nproc", "0", "color_square"]) == 2
    assert main(["train", "--nproc", "2", "color_square", "model.lora.rank=0"]) == 2
    assert "model.lora.rank" in capsys.readouterr().err
