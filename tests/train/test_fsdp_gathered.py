"""One FSDP2 pass over several micro-batches gathers the root group once (one rank, gloo, in this process)."""

from __future__ import annotations

import socket

import pytest
import torch
from torch.distributed.tensor import DTensor

from vlrl.algos.config import AlgoConfig
from vlrl.models.build import cached_model_dir
from vlrl.models.load import load_model
from vlrl.train import distributed as D
from vlrl.train.batch import CollateSpec, collate
from vlrl.train.config import OptimSection
from vlrl.train.fsdp import shard_model
from vlrl.train.trainer import Trainer


@pytest.fixture
def one_rank(monkeypatch):
    """This process as rank 0 of a one-rank gloo group (torchrun's variables set by hand)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    d = D.init_distributed("cpu")
    yield d
    D.close_distributed()


def sharded_at_forward(model, fn) -> list[bool]:
    """Whether the root group (embedding, LM head) is sharded as each forward of ``fn()`` begins: FSDP2
    registers DTensor shards while a group is sharded and whole tensors while it is gathered."""
    root = model.model
    seen: list[bool] = []
    hook = root.register_forward_pre_hook(
        lambda *_: seen.append(isinstance(root.get_input_embeddings().weight, DTensor)), prepend=True
    )  # before FSDP's own pre-forward, which gathers
    try:
        fn()
    finally:
        hook.remove()
    return seen


def test_an_update_over_three_micro_batches_gathers_the_root_once(one_rank, single_turn):
    _, trajs, _ = single_turn("qwen2_5_vl", 1.0)
    model = load_model(cached_model_dir("qwen2_5_vl", "tiny"), dtype=torch.float32, device="cpu")
    shard_model(model, one_rank, torch.float32)
    trainer = Trainer(model, AlgoConfig(), OptimSection(micro_batch_size=2), lr=1e-3)
    batch = collate(trajs[:6], CollateSpec.from_model(model))  # 3 micro-batches of 2 rows
    # Not resharded after each micro-batch's backward and gathered again by the next forward
    assert sharded_at_forward(model, lambda: trainer.sft_step(batch)) == [True, False, False]
    assert sharded_at_forward(model, lambda: trainer.logprobs(batch)) == [True, False, False]
    assert isinstance(model.model.get_input_embeddings().weight, DTensor)  # sharded again after the pass
