"""Two processes building the same checkpoint on a fresh cache (the ranks of a torchrun do): both get a whole one."""

import multiprocessing as mp
import time
from pathlib import Path


def _build_and_load(root: str, out) -> None:
    from transformers import AutoConfig

    from vlrl.models.build import cached_model_dir

    path = cached_model_dir("qwen2_5_vl", "tiny", seed=7, cache_root=root)
    end = time.monotonic() + 4  # keep reading it while the others finish their builds
    while time.monotonic() < end:
        AutoConfig.from_pretrained(str(path))  # a directory another process deleted or replaced would not load
        assert (path / "model.safetensors").stat().st_size > 0
    out.put(sorted(p.name for p in path.iterdir()))


def test_concurrent_builds_leave_one_whole_checkpoint(tmp_path: Path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_build_and_load, args=(str(tmp_path), out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    listings = [out.get(timeout=5) for _ in procs]
    assert all(names == listings[0] for names in listings) and "model.safetensors" in listings[0]
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["qwen2_5_vl-tiny-seed7"]  # no temp copy left
