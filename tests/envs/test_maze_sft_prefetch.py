"""The SFT pool's prefetch (``SftPool(prefetch=True)``, ``--sft-prefetch``): the next step's batch is fetched on a
thread while this step trains, so a step waits only for what the fetch did not hide; each step still gets the batch
it would have got without it. On a GPU the fetch also copies the batch from page-locked memory on its own stream
(tests/gpu/test_maze_sft_prefetch_gpu.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from maze_cpu import cpu_overrides  # tests/envs is on sys.path (as sample_envs)

from vlrl.envs.maze_curriculum import LevelPlan, level_config, sft_phase
from vlrl.envs.maze_sft_pool import SftPool

CPU = cpu_overrides(64)
BUILD_S = 1.0  # each batch's build made this much slower: what a step waits for when nothing hides it


@pytest.fixture
def runs(tmp_path):
    """Two runs of the same config (each its own data stream): one for each pool being compared."""
    from vlrl.train.run import Run

    made = [Run(level_config(LevelPlan("5x5", 600, 0, overrides=CPU), tmp_path / name)) for name in "ab"]
    yield made
    for run in made:
        run.close()


def _slow_builds(pool: SftPool, monkeypatch) -> None:
    real = pool._build
    monkeypatch.setattr(pool, "_build", lambda *a: time.sleep(BUILD_S) or real(*a))


def _steps(pool: SftPool, n: int, train_s: float) -> list[tuple[torch.Tensor, float]]:
    """``n`` steps that each "train" ``train_s`` on their batch: (its input ids, the step's wait for it)."""
    got = []
    for k in range(n):
        batch = pool.batch(k, first=False, device="cpu")
        got.append((batch.input_ids, pool.wait_s))
        time.sleep(train_s)
    return got


def test_a_prefetched_step_gets_the_same_batch_without_waiting_for_its_build(runs, monkeypatch):
    plain, ahead = SftPool(runs[0], 3, masked=True), SftPool(runs[1], 3, masked=True, prefetch=True)
    for pool in (plain, ahead):
        _slow_builds(pool, monkeypatch)
    try:
        without, with_ = _steps(plain, 4, 1.5 * BUILD_S), _steps(ahead, 4, 1.5 * BUILD_S)
    finally:
        ahead.close()
    for (ids, _), (ids_ahead, _) in zip(without, with_, strict=True):
        assert torch.equal(ids, ids_ahead)  # the same rows in the same order: the stream is drawn as before
    assert [w >= BUILD_S for _, w in without] == [True, True, True, False]  # the fourth cycles to a kept one
    assert with_[0][1] >= BUILD_S  # the first step has nothing before it to hide its build
    assert all(w < BUILD_S / 2 for _, w in with_[1:]), [w for _, w in with_]  # built while the step before trained
    assert runs[0].state.data_position == runs[1].state.data_position == 6
    assert not [t for t in threading.enumerate() if t.name.startswith("vlrl-sft-prefetch")]  # close() stopped it


def test_a_step_of_the_other_kind_gets_its_own_batch(runs):
    pool = SftPool(runs[0], 2, masked=True, prefetch=True)
    try:
        whole = pool.batch(0, first=False)
        first = pool.batch(1, first=True)  # the prefetch guessed a whole-episode batch: kept, not returned
        assert first.input_ids.shape[1] < whole.input_ids.shape[1]  # cut to one turn
        assert pool.batch(2, first=False) is pool.kept[False][0]  # the guessed one is the pool's second
    finally:
        pool.close()
    assert pool.built == {True: 2, False: 2}  # step 2's guess (a first-turn batch) was built and kept too


def test_a_failed_fetch_fails_the_step_that_needed_it(runs, monkeypatch):
    pool = SftPool(runs[0], 2, masked=True, prefetch=True)
    real, failed = pool._next, []

    def breaks_at_step_1(step: int, first: bool):
        if step == 1 and not failed:  # once: a step that quietly fetched again would get a batch
            failed.append(step)
            raise RuntimeError("renderer died")
        return real(step, first)

    monkeypatch.setattr(pool, "_next", breaks_at_step_1)
    try:
        pool.batch(0, first=False)  # its prefetch of step 1 fails on the thread
        with pytest.raises(RuntimeError, match="renderer died"):
            pool.batch(1, first=False)
    finally:
        pool.close()


def test_filled_by_processes_the_prefetch_takes_the_farms_batches(runs):
    """The leases' configuration: worker processes fill the pool and the prefetch thread collects from them."""
    pool = SftPool(runs[0], 2, masked=True, fill="processes", builders=1, prefetch=True)
    try:
        got = [pool.batch(k, first=False, device="cpu") for k in range(3)]
    finally:
        pool.close()
    assert all(b.size == 2 for b in got) and pool.built[False] >= 1
    assert pool._farm is None and not [t for t in threading.enumerate() if t.name.startswith("vlrl-sft-prefetch")]


def test_prefetch_refuses_takeover_batches_and_sharded_runs(runs):
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="cannot fetch takeover batches"):
        SftPool(runs[0], 2, masked=True, takeover=(2, 2), prefetch=True)
    sharded = SimpleNamespace(dist=SimpleNamespace(sharded=True))
    with pytest.raises(ValueError, match="prefetch needs a single-process run"):
        SftPool(sharded, 2, masked=True, prefetch=True)


def test_sft_phase_trains_with_the_plans_prefetch(tmp_path, monkeypatch):
    from vlrl.train.run import Run

    fetched, real = [], SftPool._fetch
    monkeypatch.setattr(SftPool, "_fetch", lambda pool, step, *a: fetched.append(step) or real(pool, step, *a))
    plan = LevelPlan("5x5", 600, 0, overrides=(*CPU, "sft.steps=4"), sft_pool=2, sft_prefetch=True)
    run = Run(level_config(plan, tmp_path))
    try:
        assert sft_phase(run, time.time() + plan.sft_seconds, plan) == (4, 4)
        assert fetched == [1, 2, 3, 4]  # each step after the first came from the prefetch (and a fifth was fetched)
        assert run.state.data_position == 4  # two batches of two rows, the prefetch of a fifth step drew none
    finally:
        run.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("vlrl-sft-prefetch")]
