"""The SFT pool's prefetch on a GPU (`pytest -m gpu`; skipped cleanly without CUDA): the next step's batch is
copied from page-locked memory on the fetcher's own stream while this step trains; what the step then reads on
its stream is the host batch, tensor for tensor (the step's stream waits for the copy's event)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vlrl.envs.maze_curriculum import LevelPlan, level_config
from vlrl.envs.maze_sft_pool import SftPool

pytestmark = pytest.mark.gpu

GPU = (
    "model.device=cuda",
    "sft.rows_per_step=8",
    "optim.micro_batch_size=8",
    "data.train_rows=64",
    "data.eval_rows=4",
)


def test_a_batch_copied_on_the_fetchers_stream_is_the_hosts(tmp_path):
    from vlrl.train.run import Run

    run = Run(level_config(LevelPlan("easy", 600, 0, overrides=GPU), tmp_path))
    pool = SftPool(run, 4, masked=True, prefetch=True)
    try:
        pool.batch(0, first=False, device="cuda")
        torch.cuda._sleep(200_000_000)  # the step's stream busy (~0.1 s) while the fetcher copies step 1's batch
        got = pool.batch(1, first=False, device="cuda")
        host = pool.kept[False][1]
        for f in dataclasses.fields(host):
            value = getattr(host, f.name)
            if isinstance(value, torch.Tensor):
                same = torch.equal(getattr(got, f.name), value.to("cuda"))  # queued on the step's stream
                assert same, f.name
        assert got.input_ids.is_cuda and pool.copy_s < 0.05  # the copy was the fetcher's: nothing left to copy
    finally:
        pool.close()
        run.close()
