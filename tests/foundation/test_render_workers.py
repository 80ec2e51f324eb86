"""The embedded renderer's worker threads: each runs torch's ops on itself (one OpenMP thread), with no effect on
the caller's threads or on threads started later, and renders exactly what the caller's thread renders."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from vlrl.messages import image_part
from vlrl.render.embedded import EmbeddedRenderer


def threads_of_a_new_thread() -> int:
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    t.start()
    t.join()
    return out[0]


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one core: torch's default is already one thread")
def test_render_workers_run_one_openmp_thread_each_and_leave_the_process_default(tiny, torch_default_threads):
    path = tiny("qwen2_5_vl").path
    default = torch.get_num_threads()  # the process default (an xdist worker's one thread is lifted here)
    narrow = EmbeddedRenderer.from_pretrained(path, workers=2)
    wide = EmbeddedRenderer.from_pretrained(path, workers=2, intra_op_threads=None)
    try:
        assert narrow._pool is not None and wide._pool is not None
        assert {narrow._pool.submit(torch.get_num_threads).result() for _ in range(4)} == {1}
        assert wide._pool.submit(torch.get_num_threads).result() == default
        assert torch.get_num_threads() == default
        assert threads_of_a_new_thread() == default  # torch.set_num_threads(1) in a worker would make this 1
    finally:
        narrow._pool.shutdown()
        wide._pool.shutdown()


def test_a_worker_renders_what_the_callers_thread_renders(tiny):
    path = tiny("qwen2_5_vl").path
    rng = np.random.default_rng(0)
    messages = [
        {
            "role": "user",
            "content": [
                image_part(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))
                for h, w in [(224, 224), (90, 150), (300, 28)]
            ]
            + [{"type": "text", "text": "what is shown?"}],
        }
    ]
    here = EmbeddedRenderer.from_pretrained(path, cache_images=0).render(messages)
    on_worker = asyncio.run(EmbeddedRenderer.from_pretrained(path, workers=1, cache_images=0).arender(messages))
    assert on_worker.token_ids == here.token_ids
    assert torch.equal(on_worker.image_grid_thw, here.image_grid_thw)
    assert torch.equal(on_worker.pixel_values, here.pixel_values)
