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


def test_a_build_that_loses_the_race_leaves_the_winners_checkpoint_in_place(tmp_path: Path, monkeypatch):
    """The race made certain: another process completes the checkpoint while this one is still writing its own.
    This one must drop its copy; the directory the other may already be loading stays the same directory."""
    import shutil

    from vlrl.models import build

    real = build.write_checkpoint
    final = tmp_path / "models" / "qwen2_5_vl-tiny-seed0"
    winner: list[int] = []

    def write_then_lose(out, *args, **kwargs):
        written = real(out, *args, **kwargs)
        shutil.copytree(written, final)  # the other process's rename lands first
        winner.append(final.stat().st_ino)
        return written

    monkeypatch.setattr(build, "write_checkpoint", write_then_lose)
    path = build.cached_model_dir("qwen2_5_vl", "tiny", cache_root=tmp_path)
    assert path == final and (final / build.MANIFEST).exists()
    assert final.stat().st_ino == winner[0]  # not deleted and replaced by this one's copy
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]  # this one's copy dropped
