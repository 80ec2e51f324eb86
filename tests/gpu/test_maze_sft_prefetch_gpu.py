"""The SFT pool's prefetch on a GPU (`pytest -m gpu`; skipped cleanly without CUDA): the next step's batch is
copied from page-locked memory on the fetcher's own stream while this step trains; what the step then reads on
its stream is the host batch, tensor for tensor, even when the copy lands late (the step's stream waits for the
copy's event)."""

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


def test_a_batch_copied_on_the_fetchers_stream_is_the_hosts(tmp_path, monkeypatch):
    from vlrl.train.run import Run

    run = Run(level_config(LevelPlan("easy", 600, 0, overrides=GPU), tmp_path))
    pool = SftPool(run, 4, masked=True, prefetch=True)
    pool._stream, real = torch.cuda.Stream(), pool._next

    def late_copy(step: int, first: bool):
        """The batch, with ~0.1 s queued on the fetcher's stream first: its copy lands well after it is queued."""
        batch = real(step, first)
        with torch.cuda.stream(pool._stream):
            torch.cuda._sleep(200_000_000)
        return batch

    monkeypatch.setattr(pool, "_next", late_copy)
    try:
        pool.batch(0, first=False, device="cuda")
        got = pool.batch(1, first=False, device="cuda")  # returns once the copy is queued, not done
        host = pool.kept[False][1]
        for f in dataclasses.fields(host):
            value = getattr(host, f.name)
            if isinstance(value, torch.Tensor):  # read on the step's stream: only right if it waited for the copy
                # bitwise, NaN where the host has NaN: the expert's tokens carry NaN rollout logprobs by design
                torch.testing.assert_close(
                    getattr(got, f.name), value.to("cuda"), rtol=0, atol=0, equal_nan=True, msg=f.name
                )
        assert got.input_ids.is_cuda and pool.copy_s < 0.05  # nothing left to copy on the step's thread
    finally:
        pool.close()
        run.close()
