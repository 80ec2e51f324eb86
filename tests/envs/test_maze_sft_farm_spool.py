"""The SFT farm's spool files hold tensors and plain values only: a spool file holding a pickle whose
``__reduce__`` would run code is refused without running it, and a real batch comes back field for field."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from vlrl.envs.maze_sft_farm import ExpertFarm, save_spool
from vlrl.train.batch import Batch, EngineTopK


class _Plant:
    """Unpickling this writes a file: proof that loading the spool ran code chosen by whoever wrote it."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def _load(path: Path):
    done: Future = Future()
    done.set_result(str(path))
    return ExpertFarm.load(object.__new__(ExpertFarm), done)  # load reads only the future's spool file


def test_a_spool_file_holding_a_code_running_pickle_is_refused_unrun(tmp_path):
    marker, path = tmp_path / "ran.txt", tmp_path / "batch-1.pt"
    torch.save({"input_ids": torch.zeros(1, 2), "plant": _Plant(marker)}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        _load(path)
    assert not marker.exists(), "loading the spool file ran the pickle's code"
    assert not path.exists()  # removed all the same


def _batch(topk: bool) -> Batch:
    b, n = 2, 5
    return Batch(
        input_ids=torch.arange(b * n).reshape(b, n),
        attention_mask=torch.ones(b, n, dtype=torch.long),
        loss_mask=torch.rand(b, n),
        rollout_logprobs=torch.randn(b, n),
        rewards=torch.randn(b, n),
        turn_index=torch.zeros(b, n, dtype=torch.long),
        pixel_values=torch.randn(8, 3, dtype=torch.bfloat16),
        image_grid_thw=torch.tensor([[1, 2, 2], [1, 2, 2]]),
        image_counts=torch.tensor([1, 1]),
        seq_lens=torch.tensor([5, 4]),
        prompt_lens=torch.tensor([2, 2]),
        groups=torch.tensor([0, 0]),
        uids=("a", "b"),
        temperature=0.7,
        engine_topk=EngineTopK(torch.tensor([0]), torch.tensor([3]), torch.tensor([[1, 2]]), torch.randn(1, 2))
        if topk
        else None,
    )


@pytest.mark.parametrize("topk", [False, True])
def test_a_saved_batch_loads_back_field_for_field(tmp_path, topk):
    sent, path = _batch(topk), tmp_path / "batch-1.pt"
    save_spool(sent, str(path))
    got = _load(path)
    assert isinstance(got, Batch) and got.uids == sent.uids and got.temperature == sent.temperature
    for name in ("input_ids", "loss_mask", "rollout_logprobs", "pixel_values", "image_grid_thw", "prompt_lens"):
        assert (
            torch.equal(getattr(got, name), getattr(sent, name))
            and getattr(got, name).dtype == getattr(sent, name).dtype
        )
    if topk:
        assert got.engine_topk is not None and sent.engine_topk is not None
        assert torch.equal(got.engine_topk.logprobs, sent.engine_topk.logprobs)
    else:
        assert got.engine_topk is None
    assert not path.exists()


def test_a_batch_without_images_round_trips(tmp_path):
    sent = _batch(False).replace(pixel_values=None, image_grid_thw=None)
    save_spool(sent, str(tmp_path / "b.pt"))
    got = _load(tmp_path / "b.pt")
    assert got.pixel_values is None and got.image_grid_thw is None
